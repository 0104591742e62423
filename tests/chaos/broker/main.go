// Command broker runs a one-broker Kafka-protocol cluster (kfake) on
// 127.0.0.1 until SIGTERM, for the chaos driver.
package main

import "github.com/inboxmill/inboxmill/tests/chaos/internal/broker"

func main() { broker.Run() }
