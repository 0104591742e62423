-- inboxmill: the inbox table, partitioned by time. One row per business
-- intent, identified by (scope, operation, key), in the partition of its
-- event's bucket.
--
-- PostgreSQL's unique keys on a partitioned table must include the
-- partition column, so the primary key alone would let one key have a row
-- in two buckets. The claim therefore goes through "{{table}}_claimable",
-- which locks the key's stripe (a row of "{{table}}_stripes", which a
-- concurrent claim of the same key waits for until this transaction ends)
-- and then looks for the key in every partition: of two claims of one
-- key, whatever their buckets, exactly one inserts, and the other sees its
-- committed row (or, under REPEATABLE READ, fails to serialize and is
-- retried).
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

-- The stripes serialize claims of one key, whatever their buckets: a
-- claim updates its key's stripe row, so a concurrent claim of the same
-- key (or, rarely, of another key of the same stripe) waits for it until
-- its transaction ends. 16384 stripes keep unrelated claims apart.
CREATE TABLE IF NOT EXISTS "{{table}}_stripes" (
    stripe integer NOT NULL,
    claims bigint  NOT NULL DEFAULT 0,
    CONSTRAINT "{{table}}_stripes_pkey" PRIMARY KEY (stripe)
);
INSERT INTO "{{table}}_stripes" (stripe) SELECT s FROM generate_series(0, 16383) AS s ON CONFLICT DO NOTHING;

-- The stripe of a key.
CREATE OR REPLACE FUNCTION "{{table}}_stripe"(p_scope text, p_operation text, p_key text)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT ((hashtextextended(p_scope || chr(31) || p_operation || chr(31) || p_key, 0) % 16384 + 16384) % 16384)::integer
$fn$;

-- True when the key is free, after waiting for any transaction that holds
-- its stripe. Under READ COMMITTED the check's query takes a snapshot of
-- its own (the function is VOLATILE), after the wait, which sees a record
-- that a concurrent claim committed meanwhile. Under REPEATABLE READ and
-- SERIALIZABLE the snapshot is the transaction's, possibly older than
-- that commit; but then the stripe row was updated by a transaction that
-- committed after the snapshot, and the UPDATE fails with a serialization
-- error (SQLSTATE 40001) instead: the claim is retried in a new
-- transaction, which sees the record.
CREATE OR REPLACE FUNCTION "{{table}}_claimable"(p_scope text, p_operation text, p_key text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    UPDATE "{{table}}_stripes" SET claims = claims + 1
        WHERE stripe = "{{table}}_stripe"(p_scope, p_operation, p_key);
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
