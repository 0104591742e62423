// Command consumer is one chaos consumer process; the driver starts,
// kills and restarts it.
package main

import "github.com/inboxmill/inboxmill/tests/chaos/internal/consumer"

func main() { consumer.Run() }
