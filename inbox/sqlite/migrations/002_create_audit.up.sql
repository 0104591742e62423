-- inboxmill: the audit table of the operator tools. One row per operator
-- action (resolve, forget, purge), written in the transaction that makes
-- the change, so that a row exists exactly when the change committed.
--
-- audit_id is text that sorts in time order. Times are INTEGER
-- microseconds since the Unix epoch, UTC, as in the inbox table. A purge's
-- row has an empty scope, operation and key, and its affected count grows
-- with every batch.
--
-- The table's name is written as a marker, quoted, which the store replaces
-- with the configured name (default "inbox") when it applies this file.
CREATE TABLE IF NOT EXISTS "{{table}}_audit" (
    audit_id       TEXT    NOT NULL PRIMARY KEY,
    logged_at      INTEGER NOT NULL,
    actor          TEXT    NOT NULL,
    action         TEXT    NOT NULL,
    scope          TEXT    NOT NULL DEFAULT '',
    operation      TEXT    NOT NULL DEFAULT '',
    "key"          TEXT    NOT NULL DEFAULT '',
    status_before  TEXT,
    attempt_before INTEGER NOT NULL DEFAULT 0,
    status_after   TEXT,
    reason         TEXT    NOT NULL,
    before_json    TEXT,
    affected       INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- A record's history, newest first.
CREATE INDEX IF NOT EXISTS "{{table}}_audit_record_idx" ON "{{table}}_audit" (scope, operation, "key", audit_id);

-- One action's entries, newest first.
CREATE INDEX IF NOT EXISTS "{{table}}_audit_action_idx" ON "{{table}}_audit" (action, audit_id);
