package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
)

// statuses in the order stats shows them.
var statuses = []inbox.Status{inbox.StatusProcessing, inbox.StatusPending, inbox.StatusCompleted, inbox.StatusFailed}

func (a *app) statsCmd() *cobra.Command {
	var output outputFlag
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Counts by operation and status, the oldest pending record and expired lease, the purge backlog",
		Long: `stats counts the records by operation and status, and names the records that
need an operator first: the oldest pending record (its age is what to alert
on), the oldest processing record whose lease expired (its worker is gone and
no redelivery took it over), and how many finished records are past their
expires_at, waiting for a purge.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			i, err := openInbox(ctx, a.db, readOnly, true)
			if err != nil {
				return err
			}
			defer i.Close()
			ov, err := i.store.Overview(ctx)
			if err != nil {
				return err
			}
			if output == "json" {
				return writeJSON(a.stdout, statsJSON(i, ov))
			}
			a.printStats(i, ov)
			return nil
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

type statsView struct {
	Table              string      `json:"table"`
	Dialect            string      `json:"dialect"`
	Now                time.Time   `json:"now"`
	Total              int64       `json:"total"`
	Counts             []countJSON `json:"counts"`
	OldestPending      *recordJSON `json:"oldest_pending"`
	OldestPendingAge   *float64    `json:"oldest_pending_age_seconds"`
	OldestExpiredLease *recordJSON `json:"oldest_expired_lease"`
	AwaitingPurge      int64       `json:"awaiting_purge"`
	// OldestExpired is the earliest expires_at in the past of a finished
	// record: null when none has expired.
	OldestExpired *time.Time `json:"oldest_expired"`
	// PurgeLag is how long that record has waited for a purge: 0 when
	// none waits, as the console's gauge reads.
	PurgeLag *float64 `json:"purge_lag_seconds"`
}

type countJSON struct {
	Operation string `json:"operation"`
	Status    string `json:"status"`
	N         int64  `json:"n"`
}

func statsJSON(i *inboxDB, ov inbox.Overview) statsView {
	v := statsView{Table: i.table, Dialect: i.target.dialect, Now: ov.Now.UTC(), Total: ov.Total,
		Counts: []countJSON{}, AwaitingPurge: ov.AwaitingPurge}
	for _, c := range ov.Counts {
		v.Counts = append(v.Counts, countJSON{c.Operation, string(c.Status), c.N})
	}
	if r := ov.OldestPending; r != nil {
		j := toJSON(r, ov.Now)
		v.OldestPending = &j
		s := ov.Now.Sub(r.CreatedAt).Seconds()
		v.OldestPendingAge = &s
	}
	if r := ov.OldestExpiredLease; r != nil {
		j := toJSON(r, ov.Now)
		v.OldestExpiredLease = &j
	}
	lag := 0.0
	if t, ok := oldestExpired(ov); ok {
		v.OldestExpired = timePtr(t)
		lag = ov.Now.Sub(t).Seconds()
	}
	v.PurgeLag = &lag
	return v
}

func (a *app) printStats(i *inboxDB, ov inbox.Overview) {
	w := a.stdout
	fmt.Fprintf(w, "table %s (%s): %s\n", i.table, i.target.dialect, plural(ov.Total, "record"))
	if len(ov.Counts) > 0 {
		byOp := map[string]map[inbox.Status]int64{}
		var ops []string
		for _, c := range ov.Counts {
			if byOp[c.Operation] == nil {
				byOp[c.Operation] = map[inbox.Status]int64{}
				ops = append(ops, c.Operation)
			}
			byOp[c.Operation][c.Status] += c.N
		}
		slices.Sort(ops)
		tw := newTable(w)
		fmt.Fprintln(tw, "OPERATION\tPROCESSING\tPENDING\tCOMPLETED\tFAILED\tTOTAL")
		totals := map[inbox.Status]int64{}
		for _, op := range ops {
			fmt.Fprint(tw, text(op))
			var sum int64
			for _, s := range statuses {
				fmt.Fprintf(tw, "\t%d", byOp[op][s])
				sum += byOp[op][s]
				totals[s] += byOp[op][s]
			}
			fmt.Fprintf(tw, "\t%d\n", sum)
		}
		if len(ops) > 1 {
			fmt.Fprint(tw, "(all)")
			for _, s := range statuses {
				fmt.Fprintf(tw, "\t%d", totals[s])
			}
			fmt.Fprintf(tw, "\t%d\n", ov.Total)
		}
		_ = tw.Flush()
	}
	conn := i.connFlags(a.db)
	if r := ov.OldestPending; r != nil {
		fmt.Fprintf(w, "oldest pending: %s, created %s ago (inboxmill inspect%s --digest %s)\n",
			r.ID, age(ov.Now, r.CreatedAt), conn, r.Digest())
	} else {
		fmt.Fprintln(w, "oldest pending: none")
	}
	if r := ov.OldestExpiredLease; r != nil {
		fmt.Fprintf(w, "oldest expired lease: %s, held by %s, lease %s (inboxmill inspect%s --digest %s)\n",
			r.ID, optional(r.LeaseOwner), leaseState(r, ov.Now), conn, r.Digest())
	} else {
		fmt.Fprintln(w, "oldest expired lease: none")
	}
	if t, ok := oldestExpired(ov); ok && ov.AwaitingPurge > 0 {
		fmt.Fprintf(w, "awaiting purge: %s past expires_at, the oldest %s ago (inboxmill purge%s --reason '...')\n",
			plural(ov.AwaitingPurge, "record"), age(ov.Now, t), conn)
	} else {
		fmt.Fprintln(w, "awaiting purge: none")
	}
}

// oldestExpired returns the earliest expires_at of a finished record when
// it has passed. Overview.OldestExpired is the earliest expires_at of any
// finished record, which lies ahead while none has expired: a purge lag
// computed from it would be negative.
func oldestExpired(ov inbox.Overview) (time.Time, bool) {
	if ov.OldestExpired.IsZero() || !ov.OldestExpired.Before(ov.Now) {
		return time.Time{}, false
	}
	return ov.OldestExpired, true
}
