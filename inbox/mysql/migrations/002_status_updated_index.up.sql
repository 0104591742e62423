-- inboxmill: index the status scans by (status, updated_at) instead of
-- (status, lease_until).
--
-- MySQL has no partial indexes, so the status index holds an entry for every
-- row, finished ones included. Under (status, lease_until) every completed
-- row (lease_until NULL) sorted by its primary key, that is at a random place
-- for random event IDs: a second randomly written B-tree beside the table
-- itself, competing for the buffer pool as the inbox grows. Under
-- (status, updated_at) a row that changes status lands at the end of its
-- status's range, so the index grows at its right edge. The pending and
-- stale-lease scans order by updated_at and the unfinished-records counts
-- group by status, which this index serves as well.
--
-- Each step runs only when it is still needed, so the file can run again
-- without failing: by hand, or by Store.Migrate after a crash between this
-- DDL (which MySQL commits implicitly) and the recording of version 2.
-- MariaDB has ADD INDEX IF NOT EXISTS and DROP INDEX IF EXISTS, MySQL has
-- not, hence a statement chosen from information_schema and prepared. The
-- new index is built before the old one goes, online (writes continue) but
-- over the whole table: expect it to take a while on a large inbox.
--
-- The table's name is written as a marker, also inside the quoted statements
-- and the table_name literals, which the store replaces with the configured
-- name (default "inbox") when it applies this file.
SET @inboxmill_ddl = (
    SELECT IF(COUNT(*) = 0,
        'ALTER TABLE `{{table}}` ADD INDEX `{{table}}_status_updated_idx` (status, updated_at)',
        'DO 0')
    FROM information_schema.statistics
    WHERE table_schema = DATABASE() AND table_name = '{{table}}' AND index_name = '{{table}}_status_updated_idx'
);
PREPARE inboxmill_stmt FROM @inboxmill_ddl;
EXECUTE inboxmill_stmt;
DEALLOCATE PREPARE inboxmill_stmt;

SET @inboxmill_ddl = (
    SELECT IF(COUNT(*) > 0,
        'ALTER TABLE `{{table}}` DROP INDEX `{{table}}_status_lease_idx`',
        'DO 0')
    FROM information_schema.statistics
    WHERE table_schema = DATABASE() AND table_name = '{{table}}' AND index_name = '{{table}}_status_lease_idx'
);
PREPARE inboxmill_stmt FROM @inboxmill_ddl;
EXECUTE inboxmill_stmt;
DEALLOCATE PREPARE inboxmill_stmt;

SET @inboxmill_ddl = NULL;
