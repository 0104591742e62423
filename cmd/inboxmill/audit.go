package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
)

func (a *app) auditCmd() *cobra.Command {
	var (
		id     idFlags
		f      inbox.AuditFilter
		all    bool
		output outputFlag
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "List the audit trail: who resolved, forgot or purged what, when and why",
		Long: `audit lists the operator actions written to <table>_audit, newest first: who
(the actor), when, what (resolve, forget, purge), the record and its state
before, and the reason. Narrow it to one record (--operation and --key, or
--digest) or one --action. It is paged like list: --after continues, --all
reads everything.`,
		Example: `  inboxmill audit --action resolve
  inboxmill audit --digest 5f0c1a2b3c4d5e6f -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			byRecord := id.digest != "" || id.key != "" || cmd.Flags().Changed("scope")
			if byRecord {
				if err := id.check(cmd); err != nil {
					return err
				}
			} else if id.operation != "" {
				return usageErr(fmt.Errorf("--operation names a record with --key or --digest; the audit trail is not filtered by operation alone"))
			}
			switch f.Action {
			case "", "resolve", "forget", "purge":
			default:
				return usageErr(fmt.Errorf("--action %q: want resolve, forget or purge", f.Action))
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
			// A forgotten record is gone, so a digest may find no record:
			// its entries are then found by the digest of theirs.
			digestOnly := ""
			if byRecord {
				rid, err := a.recordID(ctx, i, &id)
				switch {
				case err == nil:
					f.Record = &rid
				case id.digest != "" && errors.Is(err, errNoRecord):
					digestOnly, all = strings.ToLower(id.digest), true
				default:
					return err
				}
			}
			var entries []inbox.AuditEntry
			next := f.After
			for {
				f.After = next
				page, n, err := i.store.ListAudit(ctx, f)
				if errors.Is(err, inbox.ErrInvalidParams) {
					// --limit and --action are checked above: the cursor is at fault.
					return usageErr(&shownError{msg: "--after: " + invalidReasons(err), err: err})
				}
				if err != nil {
					return err
				}
				for _, e := range page {
					if digestOnly == "" || (e.Record != (inbox.ID{}) && e.Record.Digest() == digestOnly &&
						(id.operation == "" || e.Record.Operation == id.operation)) {
						entries = append(entries, e)
					}
				}
				next = n
				if !all || next == "" {
					break
				}
			}
			if byRecord && len(entries) == 0 {
				// No history: say whether there is a record at all.
				if err := a.noHistory(ctx, i, &id, digestOnly != ""); err != nil {
					return err
				}
			}
			if output == "json" {
				out := struct {
					Entries []auditJSON `json:"entries"`
					Next    string      `json:"next"`
				}{Entries: []auditJSON{}, Next: next}
				for _, e := range entries {
					out.Entries = append(out.Entries, toAuditJSON(e))
				}
				return writeJSON(a.stdout, out)
			}
			a.printAudit(entries)
			if next != "" {
				fmt.Fprintf(a.stderr, "more entries: add --after %s for the next page (or --all)\n", next)
			}
			return nil
		},
	}
	id.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.Action, "action", "", "only this action: resolve, forget or purge")
	fl.IntVar(&f.Limit, "limit", 50, "entries per page (at most 1000)")
	fl.StringVar(&f.After, "after", "", "the cursor of the page to show, printed after the previous one")
	fl.BoolVar(&all, "all", false, "read every page")
	addOutputFlag(cmd, &output)
	return cmd
}

// noHistory returns the not-found error when the record the flags name,
// which has no audit entries, does not exist either (gone is true when a
// digest found none); nil when it exists.
func (a *app) noHistory(ctx context.Context, i *inboxDB, id *idFlags, gone bool) error {
	if gone {
		where := "any operation"
		if id.operation != "" {
			where = fmt.Sprintf("operation %q", id.operation)
		}
		return fmt.Errorf("%w of %s in table %s has key digest %s, and no audit entry names one", errNoRecord, where,
			i.table, id.digest)
	}
	_, err := id.find(ctx, i, a.stderr)
	if errors.Is(err, errNoRecord) {
		return fmt.Errorf("%w, and no audit entry names it", err)
	}
	return err
}

// auditJSON is an audit entry as the json output shows it.
type auditJSON struct {
	ID            string          `json:"id"`
	At            time.Time       `json:"at"`
	Actor         string          `json:"actor"`
	Action        string          `json:"action"`
	Record        *auditRecord    `json:"record"`
	StatusBefore  string          `json:"status_before,omitempty"`
	AttemptBefore int64           `json:"attempt_before,omitempty"`
	StatusAfter   string          `json:"status_after,omitempty"`
	Reason        string          `json:"reason"`
	Before        json.RawMessage `json:"before,omitempty"`
	Count         int64           `json:"count"`
}

type auditRecord struct {
	Scope     string `json:"scope"`
	Operation string `json:"operation"`
	Key       string `json:"key"`
	Digest    string `json:"digest"`
}

func toAuditJSON(e inbox.AuditEntry) auditJSON {
	j := auditJSON{ID: e.ID, At: e.At.UTC(), Actor: e.Actor, Action: e.Action, StatusBefore: string(e.StatusBefore),
		AttemptBefore: e.AttemptBefore, StatusAfter: string(e.StatusAfter), Reason: e.Reason, Count: e.Count}
	if e.Record != (inbox.ID{}) {
		j.Record = &auditRecord{e.Record.Scope, e.Record.Operation, e.Record.Key, e.Record.Digest()}
	}
	if e.Before != "" {
		if json.Valid([]byte(e.Before)) {
			j.Before = json.RawMessage(e.Before)
		} else {
			j.Before, _ = json.Marshal(e.Before)
		}
	}
	return j
}

func (a *app) printAudit(entries []inbox.AuditEntry) {
	if len(entries) == 0 {
		fmt.Fprintln(a.stdout, "no audit entries")
		return
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "AT\tACTOR\tACTION\tRECORD\tKEY\tBEFORE\tAFTER\tCOUNT\tREASON")
	for _, e := range entries {
		rec, key, before := "-", "-", "-"
		if e.Record != (inbox.ID{}) {
			rec, key = e.Record.String(), text(e.Record.Key)
		}
		if e.StatusBefore != "" {
			before = fmt.Sprintf("%s@%d", e.StatusBefore, e.AttemptBefore)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", e.At.UTC().Format(time.RFC3339), text(e.Actor), e.Action,
			rec, key, before, optional(string(e.StatusAfter)), e.Count, text(e.Reason))
	}
	_ = tw.Flush()
}
