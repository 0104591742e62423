// Package rerun tells the user of an example what earlier runs left behind
// and starts over on request. The examples keep their inbox in a database
// that outlives them, so a second run finds its events already recorded and
// acknowledges every one as a duplicate: executed=0, which is the promise
// kept but looks like a failure unless the output says why.
package rerun

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
)

// Found is what earlier runs left in an inbox table: its records, counted
// by operation.
type Found struct {
	Table       string
	ByOperation map[string]int
}

// Total is the number of records in the table.
func (f Found) Total() int {
	n := 0
	for _, c := range f.ByOperation {
		n += c
	}
	return n
}

// Find counts the records in store's table, which must exist (call it
// after store.Migrate). It quotes the name as PostgreSQL and SQLite do,
// the databases the examples run on.
func Find(ctx context.Context, store *inbox.Store) (Found, error) {
	f := Found{Table: store.Table(), ByOperation: map[string]int{}}
	// The migrations create the table under its quoted name; identifiers
	// are checked by inbox.NewStore, so quoting here is safe.
	rows, err := store.DB().QueryContext(ctx, `SELECT operation, COUNT(*) FROM "`+f.Table+`" GROUP BY operation`)
	if err != nil {
		return f, fmt.Errorf("count the records in %s: %w", f.Table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var op string
		var n int
		if err := rows.Scan(&op, &n); err != nil {
			return f, err
		}
		f.ByOperation[op] = n
	}
	return f, rows.Err()
}

// Report prints what f found. When earlier runs left records it says that
// this run's events among them are acknowledged as duplicates, and how to
// start over. records is how many records this run makes on an empty
// inbox (its distinct events, summed over the operations): when the table
// holds as many, executed=0 is to be expected.
func (f Found) Report(out io.Writer, records int) {
	total := f.Total()
	if total == 0 {
		fmt.Fprintf(out, "inbox: table %s holds no records from earlier runs\n", f.Table)
		return
	}
	what, they := fmt.Sprintf("%d events were", total), "they are acknowledged as duplicates"
	if total == 1 {
		what, they = "1 event was", "it is acknowledged as a duplicate"
	}
	if len(f.ByOperation) > 1 {
		ops := make([]string, 0, len(f.ByOperation))
		for op, n := range f.ByOperation {
			ops = append(ops, fmt.Sprintf("%s: %d", op, n))
		}
		slices.Sort(ops)
		what = fmt.Sprintf("%d events (%s) were", total, strings.Join(ops, ", "))
	}
	expect := "executed=0 is expected"
	if total < records {
		expect = "the rest of this run's events execute"
	}
	fmt.Fprintf(out, "note: %s already recorded by an earlier run in table %s; %s (%s). Run with -reset to start over.\n",
		what, f.Table, they, expect)
}

// Reset drops what earlier runs left: the inbox, through
// store.MigrateDown(ctx, 0) (its records and every table its migrations
// made, the versions table last), and then tables, each named as the
// example writes it in SQL. It prints what it dropped.
func Reset(ctx context.Context, out io.Writer, store *inbox.Store, tables ...string) error {
	if err := store.MigrateDown(ctx, 0); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	for _, t := range tables {
		if _, err := store.DB().ExecContext(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
			return fmt.Errorf("reset: drop %s: %w", t, err)
		}
	}
	dropped := "the inbox " + store.Table()
	if len(tables) > 0 {
		dropped += " and " + strings.Join(tables, ", ")
	}
	fmt.Fprintf(out, "reset: dropped %s\n", dropped)
	return nil
}

// Queued prints, when n > 0, that n messages an earlier run published were
// never consumed and are still waiting in table: this run delivers them as
// well, so its counts include them.
func Queued(out io.Writer, n int, table string) {
	if n == 0 {
		return
	}
	fmt.Fprintf(out, "note: %d messages an earlier run left unconsumed in table %s are delivered in this run too. "+
		"Run with -reset to start over.\n", n, table)
}

// Deadline is how long an example's run may take before it gives up: Min,
// or PerEvent for each event when that is longer, so that a run asked for
// many events is not cut short by a deadline meant for the default count.
type Deadline struct {
	Min, PerEvent time.Duration
}

// For returns the deadline of a run of events events.
func (d Deadline) For(events int) time.Duration {
	return max(d.Min, time.Duration(events)*d.PerEvent)
}
