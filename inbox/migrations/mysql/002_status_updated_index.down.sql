-- inboxmill: back to the (status, lease_until) index of version 1. Like the
-- up file, each step runs only when still needed. It does not touch the
-- inbox_migrations table that Store.Migrate keeps: a Migrate after this
-- file would not apply version 2 again unless its row there is deleted.
SET @inboxmill_ddl = (
    SELECT IF(COUNT(*) = 0,
        'ALTER TABLE inbox ADD INDEX inbox_status_lease_idx (status, lease_until)',
        'DO 0')
    FROM information_schema.statistics
    WHERE table_schema = DATABASE() AND table_name = 'inbox' AND index_name = 'inbox_status_lease_idx'
);
PREPARE inboxmill_stmt FROM @inboxmill_ddl;
EXECUTE inboxmill_stmt;
DEALLOCATE PREPARE inboxmill_stmt;

SET @inboxmill_ddl = (
    SELECT IF(COUNT(*) > 0,
        'ALTER TABLE inbox DROP INDEX inbox_status_updated_idx',
        'DO 0')
    FROM information_schema.statistics
    WHERE table_schema = DATABASE() AND table_name = 'inbox' AND index_name = 'inbox_status_updated_idx'
);
PREPARE inboxmill_stmt FROM @inboxmill_ddl;
EXECUTE inboxmill_stmt;
DEALLOCATE PREPARE inboxmill_stmt;

SET @inboxmill_ddl = NULL;
