#!/usr/bin/env bash
# The test command: makes sure the databases the tests use answer (starting
# local PostgreSQL and MariaDB when they are installed but down), creates the
# test database, checks formatting and vet, and runs every test with the
# race detector. Extra arguments go to `go test`, e.g. scripts/test.sh -run Conformance.
#
#   scripts/test.sh            # every test, race detector on, real servers (CI runs this)
#   scripts/test.sh --light    # no servers: SQLite and the in-process Kafka broker only
#
# INBOXMILL_POSTGRES_DSN and INBOXMILL_MYSQL_DSN point the tests at other
# servers; then nothing local is started. With CI set, a test whose database
# is unreachable fails instead of skipping.
#
# --light runs the packages whose tests need no server, without the race
# detector and go vet (the full run has both), with INBOXMILL_TEST_LIGHT=1 (every PostgreSQL and MySQL case
# skips untried, even where a server answers), and without the console's
# browser test: a first check for a newcomer, not a substitute for the full
# run. It refuses to run with CI set.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'test.sh: %s\n' "$*" >&2; }

light=false
if [ "${1:-}" = "--light" ]; then
	light=true
	shift
fi

check_format() {
	unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
	if [ -n "$unformatted" ]; then
		log "gofmt would change: $unformatted"
		exit 1
	fi
}

if $light; then
	if [ -n "${CI:-}" ]; then
		log "--light skips every test that needs a server, and CI must not pass by skipping: run scripts/test.sh"
		exit 2
	fi
	# Every package but those whose tests need a server of their own: a
	# PostgreSQL or MariaDB (the examples on them, the transports, the
	# chaos and benchmark runs), NATS, RabbitMQ, Redis, scratch clusters.
	server_only='/(examples/(kafka|outbox|sql-queue|webhooks)|internal/crashrelay|tests/(amqp|bench|chaos|compose|failover|galera|kafka|nats|outbox|redisstream|sqlqueue))$'
	mapfile -t pkgs < <(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./... |
		grep -Ev "$server_only" | grep .)
	log "light run: ${#pkgs[@]} packages on SQLite and the in-process Kafka broker, no servers;" \
		"expect about 45 s on 2 cores with a warm build cache; a first run compiles the dependencies" \
		"before (about 190 s of CPU time)"
	check_format
	export INBOXMILL_TEST_LIGHT=1
	exec go test -count=1 -vet=off -timeout 10m -skip '^TestBrowser$' "$@" "${pkgs[@]}"
fi

log "full run: every test with the race detector, against PostgreSQL and MariaDB (and NATS, RabbitMQ, Redis);" \
	"expect about 7 minutes on 2 cores with a warm build cache, more under load or on a first run"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # port name
	for _ in $(seq 1 60); do
		port_open "$1" && return 0
		sleep 0.5
	done
	log "$2 does not answer on 127.0.0.1:$1"
	return 1
}

# missing says at once that a server is neither running nor installed here,
# instead of waiting for a port nothing will open.
missing() { # name port dsn-variable
	log "$1 is not running on 127.0.0.1:$2 and is not installed here: start it (docker compose up -d --wait)" \
		"or point $3 at one; its tests skip without it (and fail with CI set)"
}

ensure_postgres() {
	if [ -n "${INBOXMILL_POSTGRES_DSN:-}" ]; then return 0; fi
	if ! port_open 5432; then
		if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
			log "starting PostgreSQL"
			pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start || true
		else
			missing PostgreSQL 5432 INBOXMILL_POSTGRES_DSN
			return 1
		fi
		wait_port 5432 PostgreSQL || return 1
	fi
	if command -v psql >/dev/null; then
		for _ in $(seq 1 30); do
			psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null 2>&1 && break
			sleep 0.5
		done
		if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -Atqc "SELECT 1 FROM pg_database WHERE datname = 'test'")" != 1 ]; then
			log "creating PostgreSQL database test"
			psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test'
		fi
	fi
}

ensure_mysql() {
	if [ -n "${INBOXMILL_MYSQL_DSN:-}" ]; then return 0; fi
	if ! port_open 3306; then
		if [ -x /usr/sbin/mariadbd ] && command -v start-stop-daemon >/dev/null; then
			log "starting MariaDB"
			start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
		else
			missing MariaDB 3306 INBOXMILL_MYSQL_DSN
			return 1
		fi
		wait_port 3306 MariaDB || return 1
	fi
	if command -v mysql >/dev/null; then
		for _ in $(seq 1 30); do
			mysql -h 127.0.0.1 -uroot -e 'SELECT 1' >/dev/null 2>&1 && break
			sleep 0.5
		done
		mysql -h 127.0.0.1 -uroot -e 'CREATE DATABASE IF NOT EXISTS test'
	fi
}

status=0
ensure_postgres || status=1
ensure_mysql || status=1
if [ "$status" -ne 0 ] && [ -n "${CI:-}" ]; then
	log "a database is unreachable and CI is set: the tests would fail; stopping here"
	exit 1
fi

check_format
go vet ./...
exec go test -race -count=1 -timeout 30m "$@" ./...
