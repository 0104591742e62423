DROP TABLE IF EXISTS "{{table}}";
