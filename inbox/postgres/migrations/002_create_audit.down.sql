-- inboxmill: drop the audit table, and with it the record of every
-- operator action.
DROP TABLE IF EXISTS "{{table}}_audit";
