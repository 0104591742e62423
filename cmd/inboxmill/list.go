package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
)

func (a *app) listCmd() *cobra.Command {
	var (
		f      inbox.Filter
		status string
		all    bool
		output outputFlag
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List records by status, operation, scope, age and attempt, a page at a time",
		Long: `list shows the records the filters select, in primary-key order (scope,
operation, key), a page at a time: the cursor of the next page is printed
after the table (on standard error) and given back with --after; --all reads
every page. Keys are shown as they are (quoted when they hold characters a
terminal would interpret).`,
		Example: `  inboxmill list --status pending --older-than 1h
  inboxmill list --operation charge_card --attempt-above 3 -o json
  inboxmill list --status processing --all -o json | jq -r '.records[].digest'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if status != "" {
				f.Status = inbox.Status(status)
				if !f.Status.Valid() {
					return usageErr(fmt.Errorf("--status %q: want processing, pending, completed or failed", status))
				}
			}
			f.ByScope = cmd.Flags().Changed("scope")
			var errs []error
			if err := inbox.CheckText(f.Operation, inbox.MaxOperationLen); err != nil {
				errs = append(errs, fmt.Errorf("--operation %w", err))
			}
			if err := inbox.CheckText(f.Scope, inbox.MaxScopeLen); err != nil {
				errs = append(errs, fmt.Errorf("--scope %w", err))
			}
			if err := errors.Join(errs...); err != nil {
				return usageErr(err)
			}
			if f.OlderThan < 0 || f.AttemptAbove < 0 {
				return usageErr(fmt.Errorf("--older-than and --attempt-above cannot be negative"))
			}
			if f.Limit < 1 || f.Limit > 1000 {
				return usageErr(fmt.Errorf("--limit %d: want 1 to 1000", f.Limit))
			}
			ctx := cmd.Context()
			i, err := openInbox(ctx, a.db, readOnly, true)
			if err != nil {
				return err
			}
			defer i.Close()
			var recs []*inbox.Record
			next := f.After
			for {
				f.After = next
				page, err := i.store.List(ctx, f)
				if errors.Is(err, inbox.ErrInvalidParams) {
					// The other flags are checked above: the cursor is at fault.
					return usageErr(&shownError{msg: "--after: " + invalidReasons(err), err: err})
				}
				if err != nil {
					return err
				}
				recs = append(recs, page.Records...)
				next = page.Next
				if !all || next == "" {
					break
				}
			}
			now := i.store.Now()
			if output == "json" {
				out := struct {
					Records []recordJSON `json:"records"`
					Next    string       `json:"next"`
				}{Records: []recordJSON{}, Next: next}
				for _, r := range recs {
					out.Records = append(out.Records, toJSON(r, now))
				}
				return writeJSON(a.stdout, out)
			}
			a.printList(recs, now)
			if next != "" {
				fmt.Fprintf(a.stderr, "more records: add --after %s for the next page (or --all)\n", next)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&status, "status", "", "only records in this status: processing, pending, completed or failed")
	fl.StringVar(&f.Operation, "operation", "", "only records of this operation")
	fl.StringVar(&f.Scope, "scope", "", "only records of this scope (--scope '' is the global scope)")
	fl.Var(durationFlag{&f.OlderThan}, "older-than", "only records created longer ago than this (90m, 36h, 7d)")
	fl.Int64Var(&f.AttemptAbove, "attempt-above", 0, "only records whose attempt is above this (taken over that often)")
	fl.IntVar(&f.Limit, "limit", 50, "records per page (at most 1000)")
	fl.StringVar(&f.After, "after", "", "the cursor of the page to show, printed after the previous one")
	fl.BoolVar(&all, "all", false, "read every page")
	addOutputFlag(cmd, &output)
	return cmd
}

func (a *app) printList(recs []*inbox.Record, now time.Time) {
	if len(recs) == 0 {
		fmt.Fprintln(a.stdout, "no records")
		return
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "SCOPE\tOPERATION\tKEY\tDIGEST\tSTATUS\tATTEMPT\tAGE\tUPDATED\tLEASE")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s ago\t%s\n", text(r.Scope), text(r.Operation), text(r.Key),
			r.Digest(), r.Status, r.Attempt, age(now, r.CreatedAt), age(now, r.UpdatedAt), leaseState(r, now))
	}
	_ = tw.Flush()
	fmt.Fprintf(a.stdout, "%d record(s)\n", len(recs))
}

// plural renders n and a noun.
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "ch") || strings.HasSuffix(noun, "s") {
		return fmt.Sprintf("%d %ses", n, noun)
	}
	if strings.HasSuffix(noun, "y") {
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(noun, "y"))
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
