-- inboxmill: back to the (status, lease_until) index of version 1. Like the
-- up file, each step runs only when still needed. Store.MigrateDown runs it
-- and forgets version 2 in <table>_migrations; run by hand, delete that row
-- too, or a later Migrate would not apply version 2 again.
SET @inboxmill_ddl = (
    SELECT IF(COUNT(*) = 0,
        'ALTER TABLE `{{table}}` ADD INDEX `{{table}}_status_lease_idx` (status, lease_until)',
        'DO 0')
    FROM information_schema.statistics
    WHERE table_schema = DATABASE() AND table_name = '{{table}}' AND index_name = '{{table}}_status_lease_idx'
);
PREPARE inboxmill_stmt FROM @inboxmill_ddl;
EXECUTE inboxmill_stmt;
DEALLOCATE PREPARE inboxmill_stmt;

SET @inboxmill_ddl = (
    SELECT IF(COUNT(*) > 0,
        'ALTER TABLE `{{table}}` DROP INDEX `{{table}}_status_updated_idx`',
        'DO 0')
    FROM information_schema.statistics
    WHERE table_schema = DATABASE() AND table_name = '{{table}}' AND index_name = '{{table}}_status_updated_idx'
);
PREPARE inboxmill_stmt FROM @inboxmill_ddl;
EXECUTE inboxmill_stmt;
DEALLOCATE PREPARE inboxmill_stmt;

SET @inboxmill_ddl = NULL;
