#!/usr/bin/env bash
# Benchmarks the dedup middleware on every database against the handler alone
# (plain: the same business INSERT in its own transaction), measured in the
# same run, and prints one RATIO line per database and path:
#
#   RATIO <fresh|duplicate>_vs_plain dialect=<d> workers=1 value=<throughput ratio>
#
# A value of 0.8 means the middleware keeps 80% of the handler's own
# throughput. Databases are prepared as for scripts/test.sh. Extra arguments
# go to `go test` (e.g. -benchtime 5s -count 3).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench 'BenchmarkMiddleware' -benchmem "$@" ./dedup | tee "$out"
awk '
/^BenchmarkMiddleware\// {
	split($1, p, "/"); db = p[2]; path = p[3]; sub(/-[0-9]+$/, "", path)
	ns[db "/" path] += $3; n[db "/" path]++
	if (!(db in seen)) { seen[db] = 1; order[++dbs] = db }
}
END {
	for (i = 1; i <= dbs; i++) {
		db = order[i]; base = ns[db "/plain"] / n[db "/plain"]
		for (j = 1; j <= 2; j++) {
			path = (j == 1) ? "fresh" : "duplicate"
			if (n[db "/" path] == 0 || base == 0) continue
			printf "RATIO %s_vs_plain dialect=%s workers=1 value=%.2f\n", path, db, base / (ns[db "/" path] / n[db "/" path])
		}
	}
}' "$out"
