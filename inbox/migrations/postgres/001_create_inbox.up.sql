-- inboxmill: the inbox table. One row per business intent, identified by
-- (scope, operation, key). The unique primary key is what makes a claim atomic:
-- two deliveries of one event race on the INSERT and exactly one wins.
--
-- The identifier "inbox" below is replaced by the configured table name when
-- the store applies this file; run it as-is when your table is called inbox.
CREATE TABLE IF NOT EXISTS inbox (
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
    CONSTRAINT inbox_pkey PRIMARY KEY (scope, operation, key),
    CONSTRAINT inbox_status_check CHECK (status IN ('processing', 'completed', 'failed', 'pending'))
);

-- Purge walks expired rows in small batches.
CREATE INDEX IF NOT EXISTS inbox_expires_at_idx ON inbox (expires_at) WHERE expires_at IS NOT NULL;

-- Stuck-lease and pending scans only ever look at unfinished rows; keeping
-- finished ones out keeps this index small however large the table grows.
CREATE INDEX IF NOT EXISTS inbox_status_lease_idx ON inbox (status, lease_until)
    WHERE status IN ('processing', 'pending');
