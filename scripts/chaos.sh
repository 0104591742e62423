#!/usr/bin/env bash
# The fault-injection suite: builds the chaos programs (tests/chaos: driver,
# consumer, broker) into a temporary directory and runs the driver, which
# starts a Kafka-protocol broker and consumer processes, kills them, cuts
# their database connections, restarts them, and then checks that every
# published event had exactly one effect. Arguments go to the driver:
#
#   scripts/chaos.sh --quick            # CI: 3,000 events, every mode, modes in parallel, ~25-40 s
#   scripts/chaos.sh --quick --modes kafka-parallel   # the parallel Kafka consumer alone
#   scripts/chaos.sh                    # 100,000 events, 8 consumers per mode, 60 SIGKILLs and more
#   scripts/chaos.sh --seed 42 --keep   # the same stream and fault plan again; keep tables and logs
#   scripts/chaos.sh --quick --databases postgres --pg-partitioned   # CI too: against a partitioned inbox
#   scripts/chaos.sh --quick --modes kafka-reserve --reserve-batch   # CI too: reserve mode in batches
#   scripts/chaos.sh --help
#
# Every mode runs on PostgreSQL and on MySQL/MariaDB (--databases
# postgres,mysql, the default). It needs PostgreSQL (INBOXMILL_POSTGRES_DSN,
# default postgres://postgres@127.0.0.1:5432/test?sslmode=disable) and
# MariaDB (INBOXMILL_MYSQL_DSN, default
# root@tcp(127.0.0.1:3306)/test?parseTime=true). The last line is
#
#   CHAOS events=<n> effects=<n> duplicated_effects=<n> lost=<n> conflicts_routed=<n> kills=<n> seed=<n>
#
# and the exit status is 0 only when every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(mktemp -d "${TMPDIR:-/tmp}/inboxmill-chaos-bin.XXXXXX")
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./tests/chaos/driver ./tests/chaos/consumer ./tests/chaos/broker

status=0
"$bin/driver" "$@" || status=$?
exit "$status"
