-- inboxmill: the inbox table. One row per business intent, identified by
-- (scope, operation, key). The unique primary key is what makes a claim atomic:
-- two deliveries of one event race on the INSERT and exactly one wins.
--
-- Times are INTEGER microseconds since the Unix epoch, UTC: SQLite has no
-- timestamp type, and integers compare correctly where formatted text with
-- mixed offsets would not.
--
-- The table's name is written as a marker, quoted, which the store replaces
-- with the configured name (default "inbox") when it applies this file.
CREATE TABLE IF NOT EXISTS "{{table}}" (
    scope          TEXT    NOT NULL DEFAULT '',
    operation      TEXT    NOT NULL,
    "key"          TEXT    NOT NULL,
    payload_hash   BLOB    NOT NULL,
    status         TEXT    NOT NULL CHECK (status IN ('processing', 'completed', 'failed', 'pending')),
    attempt        INTEGER NOT NULL DEFAULT 1,
    lease_owner    TEXT,
    lease_until    INTEGER,
    result         BLOB,
    resource_id    TEXT,
    correlation_id TEXT,
    external_ref   TEXT,
    error          TEXT,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    expires_at     INTEGER,
    PRIMARY KEY (scope, operation, "key")
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS "{{table}}_expires_at_idx" ON "{{table}}" (expires_at) WHERE expires_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS "{{table}}_status_lease_idx" ON "{{table}}" (status, lease_until)
    WHERE status IN ('processing', 'pending');
