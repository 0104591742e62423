-- inboxmill: the inbox table. One row per business intent, identified by
-- (scope, operation, key). The unique primary key is what makes a claim atomic:
-- two deliveries of one event race on the INSERT and exactly one wins.
--
-- The table's name is written as a marker, quoted, which the store replaces
-- with the configured name (default "inbox") when it applies this file.
CREATE TABLE IF NOT EXISTS "{{table}}" (
    scope          text        NOT NULL DEFAULT '',
    operation      text        NOT NULL,
    key            text        NOT NULL,
    payload_hash   bytea       NOT NULL,
    status         text        NOT NULL,
    attempt        bigint      NOT NULL DEFAULT 1,
    lease_owner    text,
    lease_until    timestamptz,
    result         bytea,
    resource_id    text,
    correlation_id text,
    external_ref   text,
    error          text,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    expires_at     timestamptz,
    CONSTRAINT "{{table}}_pkey" PRIMARY KEY (scope, operation, key),
    CONSTRAINT "{{table}}_status_check" CHECK (status IN ('processing', 'completed', 'failed', 'pending'))
);

-- Purge walks expired rows in small batches.
CREATE INDEX IF NOT EXISTS "{{table}}_expires_at_idx" ON "{{table}}" (expires_at) WHERE expires_at IS NOT NULL;

-- Stuck-lease and pending scans only ever look at unfinished rows; keeping
-- finished ones out keeps this index small however large the table grows.
CREATE INDEX IF NOT EXISTS "{{table}}_status_lease_idx" ON "{{table}}" (status, lease_until)
    WHERE status IN ('processing', 'pending');
