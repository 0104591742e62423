// Command driver runs the fault-injection suite: see scripts/chaos.sh, which
// builds it next to the broker and consumer programs it starts.
package main

import (
	"os"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/driver"
)

func main() { os.Exit(driver.Main(os.Args[1:], os.Stdout, os.Stderr)) }
