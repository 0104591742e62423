package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
every page, writing each as it is read (so it holds one page in memory,
and a table's columns line up page by page). Keys are shown as they are (quoted when they hold characters a
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
			// Each page is written as it is read, so that --all holds one
			// page in memory, however large the table.
			var w listWriter = &tableList{a: a}
			if output == "json" {
				w = &jsonList{w: a.stdout}
			}
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
				if err := w.page(page.Records, i.store.Now()); err != nil {
					return err
				}
				next = page.Next
				if !all || next == "" {
					break
				}
			}
			return w.end(next)
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

// listWriter writes a listing page by page.
type listWriter interface {
	// page writes records, the next page of the listing, with their ages
	// at now.
	page(records []*inbox.Record, now time.Time) error
	// end finishes the listing; next is the cursor of the page after the
	// last one written ("" when there is none).
	end(next string) error
}

// tableList writes a listing as a table for people: one header, each
// page's rows aligned among themselves, and the count at the end.
type tableList struct {
	a *app
	n int
}

func (l *tableList) page(recs []*inbox.Record, now time.Time) error {
	if len(recs) == 0 {
		return nil
	}
	tw := newTable(l.a.stdout)
	if l.n == 0 {
		fmt.Fprintln(tw, "SCOPE\tOPERATION\tKEY\tDIGEST\tSTATUS\tATTEMPT\tAGE\tUPDATED\tLEASE")
	}
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s ago\t%s\n", text(r.Scope), text(r.Operation), text(r.Key),
			r.Digest(), r.Status, r.Attempt, age(now, r.CreatedAt), age(now, r.UpdatedAt), leaseState(r, now))
	}
	l.n += len(recs)
	return tw.Flush()
}

func (l *tableList) end(next string) error {
	if l.n == 0 {
		_, err := fmt.Fprintln(l.a.stdout, "no records")
		return err
	}
	fmt.Fprintf(l.a.stdout, "%d record(s)\n", l.n)
	if next != "" {
		fmt.Fprintf(l.a.stderr, "more records: add --after %s for the next page (or --all)\n", next)
	}
	return nil
}

// jsonList writes a listing as the JSON document writeJSON would write of
// {"records": [...], "next": "..."}, one record at a time.
type jsonList struct {
	w io.Writer
	n int
}

func (l *jsonList) page(recs []*inbox.Record, now time.Time) error {
	if len(recs) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if l.n == 0 {
		buf.WriteString("{\n  \"records\": [")
	}
	for _, r := range recs {
		b, err := json.MarshalIndent(toJSON(r, now), "    ", "  ")
		if err != nil {
			return err
		}
		if l.n > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString("\n    ")
		buf.Write(b)
		l.n++
	}
	_, err := l.w.Write(buf.Bytes())
	return err
}

func (l *jsonList) end(next string) error {
	var buf bytes.Buffer
	if l.n == 0 {
		buf.WriteString("{\n  \"records\": [")
	} else {
		buf.WriteString("\n  ")
	}
	cursor, err := json.Marshal(next)
	if err != nil {
		return err
	}
	buf.WriteString("],\n  \"next\": ")
	buf.Write(cursor)
	buf.WriteString("\n}\n")
	_, err = l.w.Write(buf.Bytes())
	return err
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
