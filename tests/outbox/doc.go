// Package outboxtests holds the transactional outbox end-to-end test: a
// deduplicated Kafka consumer publishes follow-up events through a
// watermill-sql publisher bound to the claim's transaction, Watermill's
// Forwarder moves them to Kafka while it is killed between the Kafka write
// and the outbox ack, and a second deduplicated consumer runs once per
// event. It runs against an in-process Kafka-protocol broker on 127.0.0.1
// and real PostgreSQL and MariaDB servers (see tests/testdb).
package outboxtests
