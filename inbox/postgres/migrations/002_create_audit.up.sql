-- inboxmill: the audit table of the operator tools. One row per operator
-- action (resolve, forget, purge), written in the transaction that makes
-- the change, so that a row exists exactly when the change committed.
--
-- audit_id is text that sorts in time order (COLLATE "C": byte order,
-- whatever the database's collation). A purge's row has an empty scope,
-- operation and key, and its affected count grows with every batch.
--
-- The table's name is written as a marker, quoted, which the store replaces
-- with the configured name (default "inbox") when it applies this file.
CREATE TABLE IF NOT EXISTS "{{table}}_audit" (
    audit_id       text COLLATE "C" NOT NULL,
    logged_at      timestamptz NOT NULL,
    actor          text        NOT NULL,
    action         text        NOT NULL,
    scope          text        NOT NULL DEFAULT '',
    operation      text        NOT NULL DEFAULT '',
    key            text        NOT NULL DEFAULT '',
    status_before  text,
    attempt_before bigint      NOT NULL DEFAULT 0,
    status_after   text,
    reason         text        NOT NULL,
    before_json    text,
    affected       bigint      NOT NULL DEFAULT 0,
    CONSTRAINT "{{table}}_audit_pkey" PRIMARY KEY (audit_id)
);

-- A record's history, newest first.
CREATE INDEX IF NOT EXISTS "{{table}}_audit_record_idx" ON "{{table}}_audit" (scope, operation, key, audit_id);

-- One action's entries, newest first.
CREATE INDEX IF NOT EXISTS "{{table}}_audit_action_idx" ON "{{table}}_audit" (action, audit_id);
