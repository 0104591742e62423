#!/usr/bin/env bash
# Benchmarks the dedup middleware side by side with the handler alone, on the
# same machine and data, and prints ratios between measurements of the same
# run (docs/benchmarks.md explains every line):
#
#   BENCH scenario=<name> dialect=<pg|mysql|sqlite> workers=<n> msgs=<n> msgs_per_s=<x> p50_us=<x> p99_us=<x> allocs_per_msg=<x>
#   SEED dialect=<d> rows=<n> added=<n> seconds=<x>
#   RATIO <name> dialect=<d> workers=<n> value=<x>
#
# Flags go to the program (tests/bench):
#
#   --quick                 1000 messages per measurement, inbox growth up to 1M rows (under 5 minutes on 2 cores)
#   --dialects pg,mysql,sqlite
#   --workers 1,8,32
#   --scenarios plain,plain_stmt,inboxmill,inboxmill_dup,inboxmill_dup_tx,inboxmill_reserve,watermill_dedup,
#               select_then_insert,growth,kafka,sqlqueue
#   --msgs N                messages per measurement (5000 by default)
#   --rounds N              measurements per scenario, dialect and worker count, interleaved;
#                           BENCH reports the median (3 by default; each round is logged to stderr)
#   --growth 0,1m,10m       inbox sizes for the growth scenario
#   --prepare auto          the stores' inbox.Config.Prepare (auto, always, never)
#   --cpuprofile FILE       CPU profile of the whole run, for go tool pprof
#   --markdown FILE         the results and ratios as Markdown tables
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
