-- inboxmill: drop the partitioned inbox table with its partitions, and
-- its functions.
DROP TABLE IF EXISTS "{{table}}";
DROP FUNCTION IF EXISTS "{{table}}_claimable"(text, text, text);
DROP FUNCTION IF EXISTS "{{table}}_stripe"(text, text, text);
DROP TABLE IF EXISTS "{{table}}_stripes";
DROP FUNCTION IF EXISTS "{{table}}_add_partition"(text, timestamptz, timestamptz);
