-- inboxmill: the inbox table. One row per business intent, identified by
-- (scope, operation, key). The unique primary key is what makes a claim atomic:
-- two deliveries of one event race on the INSERT and exactly one wins.
--
-- scope, operation and key are VARBINARY so that they compare byte for byte:
-- a case-insensitive or PAD SPACE collation would make "Order-1", "order-1"
-- and "order-1 " the same intent.
--
-- The table's name is written as a marker, quoted, which the store replaces
-- with the configured name (default "inbox") when it applies this file.
CREATE TABLE IF NOT EXISTS `{{table}}` (
    scope          VARBINARY(255) NOT NULL DEFAULT '',
    operation      VARBINARY(255) NOT NULL,
    `key`          VARBINARY(255) NOT NULL,
    payload_hash   VARBINARY(64)  NOT NULL,
    status         VARCHAR(16)    NOT NULL,
    attempt        BIGINT         NOT NULL DEFAULT 1,
    lease_owner    VARCHAR(255)   NULL,
    lease_until    DATETIME(6)    NULL,
    result         LONGBLOB       NULL,
    resource_id    VARCHAR(255)   NULL,
    correlation_id VARCHAR(255)   NULL,
    external_ref   VARCHAR(255)   NULL,
    error          TEXT           NULL,
    created_at     DATETIME(6)    NOT NULL,
    updated_at     DATETIME(6)    NOT NULL,
    expires_at     DATETIME(6)    NULL,
    PRIMARY KEY (scope, operation, `key`),
    KEY `{{table}}_expires_at_idx` (expires_at),
    KEY `{{table}}_status_lease_idx` (status, lease_until),
    CONSTRAINT `{{table}}_status_check` CHECK (status IN ('processing', 'completed', 'failed', 'pending'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
