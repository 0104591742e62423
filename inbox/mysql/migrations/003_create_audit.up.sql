-- inboxmill: the audit table of the operator tools. One row per operator
-- action (resolve, forget, purge), written in the transaction that makes
-- the change, so that a row exists exactly when the change committed.
--
-- audit_id is ASCII text that sorts in time order. scope, operation and key
-- are VARBINARY like the inbox table's, so that they compare byte for byte.
-- A purge's row has an empty scope, operation and key, and its affected
-- count grows with every batch.
--
-- CREATE TABLE IF NOT EXISTS can run again without failing: by hand, or by
-- Store.Migrate after a crash between this DDL (which MySQL commits
-- implicitly) and the recording of version 3.
--
-- The table's name is written as a marker, quoted, which the store replaces
-- with the configured name (default "inbox") when it applies this file.
CREATE TABLE IF NOT EXISTS `{{table}}_audit` (
    audit_id       VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    logged_at      DATETIME(6)    NOT NULL,
    actor          VARCHAR(255)   NOT NULL,
    action         VARCHAR(16)    NOT NULL,
    scope          VARBINARY(255) NOT NULL DEFAULT '',
    operation      VARBINARY(255) NOT NULL DEFAULT '',
    `key`          VARBINARY(255) NOT NULL DEFAULT '',
    status_before  VARCHAR(16)    NULL,
    attempt_before BIGINT         NOT NULL DEFAULT 0,
    status_after   VARCHAR(16)    NULL,
    reason         TEXT           NOT NULL,
    before_json    MEDIUMTEXT     NULL,
    affected       BIGINT         NOT NULL DEFAULT 0,
    PRIMARY KEY (audit_id),
    KEY `{{table}}_audit_record_idx` (scope, operation, `key`, audit_id),
    KEY `{{table}}_audit_action_idx` (action, audit_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
