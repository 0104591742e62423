# Shortcuts; the scripts are the source of truth.
STATICCHECK = honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test test-short bench lint fmt quickstart

test: ## every test, race detector on, real databases (see scripts/test.sh)
	scripts/test.sh

test-short: ## no servers: SQLite and the in-process Kafka broker only (scripts/test.sh --light)
	scripts/test.sh --light

bench: ## middleware against the plain handler on every database, with ratios
	scripts/bench.sh

lint:
	test -z "$$(gofmt -l .)"
	go vet ./...
	go run $(STATICCHECK) ./...

fmt:
	gofmt -w .

quickstart:
	go run ./examples/quickstart
