-- inboxmill: the inbox table, partitioned by time. One row per business
-- intent, identified by (scope, operation, key), in the partition of its
-- event's bucket.
--
-- PostgreSQL's unique keys on a partitioned table must include the
-- partition column, so the primary key alone would let one key have a row
-- in two buckets. The claim therefore goes through "{{table}}_claimable",
-- which locks the key (a transaction-level advisory lock, which a
-- concurrent claim of the same key waits for until this transaction ends)
-- and then looks for it in every partition, in a snapshot taken after the
-- lock: of two claims of one key, whatever their buckets, exactly one
-- inserts, and the other sees its committed row.
--
-- The table's name is written as a marker, quoted, which the store replaces
-- with the configured name (default "inbox") when it applies this file.
CREATE TABLE IF NOT EXISTS "{{table}}" (
    scope          text        NOT NULL DEFAULT '',
    operation      text        NOT NULL,
    key            text        NOT NULL,
    -- The start of the record's bucket; a row written by hand lands in the
    -- current one.
    bucket         timestamptz NOT NULL DEFAULT now(),
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
    CONSTRAINT "{{table}}_pkey" PRIMARY KEY (scope, operation, key, bucket),
    CONSTRAINT "{{table}}_status_check" CHECK (status IN ('processing', 'completed', 'failed', 'pending'))
) PARTITION BY RANGE (bucket);

-- Purge checks a partition for records to keep (never expiring, or not
-- yet) before it drops it, and deletes leftovers in batches: a full index,
-- so that IS NULL is found by it too.
CREATE INDEX IF NOT EXISTS "{{table}}_expires_at_idx" ON "{{table}}" (expires_at);

-- Stuck-lease and pending scans only ever look at unfinished rows.
CREATE INDEX IF NOT EXISTS "{{table}}_status_lease_idx" ON "{{table}}" (status, lease_until)
    WHERE status IN ('processing', 'pending');

-- True when the key is free, after waiting for any transaction that holds
-- it. VOLATILE: its query takes a snapshot of its own, after the lock,
-- which sees a row that a concurrent claim committed meanwhile. Under
-- REPEATABLE READ the snapshot is the transaction's, older than the lock,
-- so claims refuse to run there (SERIALIZABLE is safe: it aborts one of
-- two such claims).
CREATE OR REPLACE FUNCTION "{{table}}_claimable"(p_scope text, p_operation text, p_key text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'inboxmill: a claim on a partitioned table cannot run under REPEATABLE READ; use READ COMMITTED or SERIALIZABLE'
            USING ERRCODE = '0A000';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(
        '{{table}}' || chr(31) || p_scope || chr(31) || p_operation || chr(31) || p_key, 0));
    RETURN NOT EXISTS (SELECT 1 FROM "{{table}}" WHERE scope = p_scope AND operation = p_operation AND key = p_key);
END
$fn$;

-- Creates and attaches the partition of one bucket unless it exists.
-- CREATE then ATTACH rather than CREATE ... PARTITION OF: attaching locks
-- the table in SHARE UPDATE EXCLUSIVE mode, which claims do not wait for.
-- Concurrent callers queue on an advisory lock.
CREATE OR REPLACE FUNCTION "{{table}}_add_partition"(p_name text, p_from timestamptz, p_to timestamptz)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('inboxmill partitions of ' || '{{table}}', 0));
    IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = '"{{table}}"'::regclass AND c.relname = p_name) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', p_name, '{{table}}');
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', '{{table}}', p_name, p_from, p_to);
    RETURN true;
END
$fn$;
