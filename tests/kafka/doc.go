// Package kafkatests holds the Kafka end-to-end tests: the dedup middleware
// behind watermill-kafka consumer groups, against an in-process
// Kafka-protocol broker on 127.0.0.1 and real PostgreSQL and MariaDB
// servers (see tests/testdb for how they are found).
package kafkatests
