#!/usr/bin/env bash
# Benchmarks the dedup middleware side by side with the handler alone, on the
# same machine and data, and prints ratios between measurements of the same
# run (docs/benchmarks.md explains every line):
#
#   BENCH scenario=<name> dialect=<pg|mysql|sqlite> workers=<n> msgs=<n> msgs_per_s=<x> p50_us=<x> p99_us=<x> allocs_per_msg=<x>
#   SEED dialect=<d> rows=<n> added=<n> seconds=<x>            (keys=uuidv7 appended for time-ordered keys)
#   RATIO <name> dialect=<d> workers=<n> value=<x>
#   PURGE dialect=<d> method=delete rows=<n> seconds=<x> wal_bytes=<n> after_seconds=<x> after_wal_bytes=<n> keys=<random|uuidv7> batch=<n>
#
# A PURGE line is one purge of <rows> expired records (and a tenth as many
# live ones that must stay) from a fresh inbox: seconds and wal_bytes are
# the removal (method delete: inbox.Store.Purge, <batch> rows per DELETE,
# no pause), after_* the maintenance it leaves (PostgreSQL: VACUUM of the
# table; MariaDB: the wait until InnoDB's purge threads are through;
# SQLite: 0). WAL bytes are pg_wal_lsn_diff on PostgreSQL, the growth of
# Innodb_lsn_current (redo log) on MariaDB, both server-wide; 0 on SQLite.
#
# Flags go to the program (tests/bench):
#
#   --quick                 1000 messages per measurement, inbox growth up to 1M rows (under 5 minutes on 2 cores)
#   --dialects pg,mysql,sqlite
#   --workers 1,8,32
#   --scenarios plain,plain_stmt,inboxmill,inboxmill_group,inboxmill_group_pgx,inboxmill_dup,inboxmill_dup_tx,
#               inboxmill_reserve,inboxmill_reserve_batch,watermill_dedup,
#               select_then_insert,growth,kafka,sqlqueue (the default), and purge (only when named)
#   --msgs N                messages per measurement (5000 by default)
#   --rounds N              measurements per scenario, dialect and worker count, interleaved;
#                           BENCH reports the median (3 by default; each round is logged to stderr)
#   --warmup D              per measurement, how long the workers keep delivering before the clock
#                           starts (2s; --quick 1s), so that the adaptive limits of groups and
#                           batches are measured settled: a consumer runs for hours, not for 5000 messages
#   --growth 0,1m,10m       inbox sizes for the growth scenario
#   --keys random,uuidv7    event IDs for growth and purge: random (UUIDv4, the default) and/or
#                           time-ordered (UUIDv7); growth's uuidv7 scenarios are growth_uuidv7_<size>
#   --purge 1m,10m          expired rows for the purge scenario (1m; --quick 100k, --smoke 1k)
#   --purge-batch N         rows per purge DELETE (default inbox.DefaultPurgeBatchSize, 1000)
#   --prepare auto          the stores' inbox.Config.Prepare (auto, always, never)
#   --sqlqueue-batch N      SubscribeBatchSize of sqlqueue's batched variants (32; 1 leaves them out)
#   --cpuprofile FILE       CPU profile of the whole run, for go tool pprof
#   --markdown FILE         the results, ratios and purges as Markdown tables
#   --plot DIR              SVG charts: per dialect throughput and p99 against workers (one line per
#                           scenario) and the ratios to the bare handler; the same through Kafka
#   --partitions 4,16       the kafka scenario's partition counts
#   --kafka-variants LIST   the kafka scenario's variants (plain, inboxmill, group, group_pgx, parallel_plain,
#                           parallel, parallel_group, parallel_group_pgx; all by default)
#   --kafka-warmup N        the kafka scenario's messages handled before its clock starts (30000; --quick 10000)
#   --kafka-in-flight N     the parallel consumer's MaxInFlightPerPartition (32 by default)
#   --kafka-pool N          the database pool of the parallel variants (16)
#
# PostgreSQL and MariaDB are those of scripts/test.sh (127.0.0.1, database
# test), or INBOXMILL_POSTGRES_DSN / INBOXMILL_MYSQL_DSN; leave a server out
# with --dialects. Every table is created under a unique name and dropped.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/bench" ./tests/bench
"$dir/bench" "$@"
