package main

import (
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
)

// historyLimit is how many audit entries inspect shows.
const historyLimit = 20

func (a *app) inspectCmd() *cobra.Command {
	var (
		id     idFlags
		output outputFlag
	)
	cmd := &cobra.Command{
		Use:   "inspect (--operation NAME --key KEY [--scope SCOPE] | --digest HEX)",
		Short: "Show one record: every column, its decoded output, its lease and its audit history",
		Long: `inspect shows one record, named by --operation and --key (and --scope), or by
the key digest that log lines carry as key_digest (logs never print keys):
every column, the stored output of a transactional record decoded (message
UUIDs, metadata, payload sizes), who holds its lease and for how long, the
audit entries of operator actions on it, and the commands that would resolve
or forget it. Finding a record by digest scans the key columns (with
--operation, only that operation's).`,
		Example: `  inboxmill inspect --digest 5f0c1a2b3c4d5e6f
  inboxmill inspect --operation charge_card --key pi_0013 -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := id.check(cmd); err != nil {
				return err
			}
			ctx := cmd.Context()
			i, err := openInbox(ctx, a.db, readOnly, true)
			if err != nil {
				return err
			}
			defer i.Close()
			rec, err := id.find(ctx, i, a.stderr)
			if err != nil {
				return err
			}
			recID := rec.ID
			history, _, err := i.store.ListAudit(ctx, inbox.AuditFilter{Record: &recID, Limit: historyLimit})
			if err != nil {
				return err
			}
			now := i.store.Now()
			if output == "json" {
				return writeJSON(a.stdout, inspectJSON(rec, history, now))
			}
			a.printRecord(a.stdout, i, rec, history, now)
			return nil
		},
	}
	id.add(cmd)
	addOutputFlag(cmd, &output)
	return cmd
}

// inspectView is inspect's json output.
type inspectView struct {
	recordJSON
	IdempotencyKey string `json:"idempotency_key"`
	// LeaseRemainingSeconds is how long the lease has left (negative: it
	// expired that long ago); null without a lease.
	LeaseRemainingSeconds *float64    `json:"lease_remaining_seconds"`
	Output                *outputView `json:"output"`
	History               []auditJSON `json:"history"`
	Now                   time.Time   `json:"now"`
}

type outputView struct {
	Bytes    int             `json:"bytes"`
	Messages []storedMessage `json:"messages"`
	// Error says why the output could not be decoded.
	Error string `json:"error,omitempty"`
}

func inspectJSON(rec *inbox.Record, history []inbox.AuditEntry, now time.Time) inspectView {
	v := inspectView{recordJSON: toJSON(rec, now), IdempotencyKey: rec.IdempotencyKey(), Now: now.UTC(), History: []auditJSON{}}
	if !rec.LeaseUntil.IsZero() {
		s := rec.LeaseUntil.Sub(now).Seconds()
		v.LeaseRemainingSeconds = &s
	}
	if len(rec.Result) > 0 {
		msgs, err := decodeOutput(rec.Result)
		v.Output = &outputView{Bytes: len(rec.Result), Messages: msgs}
		if err != nil {
			v.Output.Error = err.Error()
		}
		if v.Output.Messages == nil {
			v.Output.Messages = []storedMessage{}
		}
	}
	for _, e := range history {
		v.History = append(v.History, toAuditJSON(e))
	}
	return v
}

func (a *app) printRecord(w io.Writer, i *inboxDB, rec *inbox.Record, history []inbox.AuditEntry, now time.Time) {
	fmt.Fprintf(w, "record %s in table %s\n", rec.ID, i.table)
	tw := newTable(w)
	row := func(k, v string) { fmt.Fprintf(tw, "  %s\t%s\n", k, v) }
	row("scope", text(rec.Scope))
	row("operation", text(rec.Operation))
	row("key", text(rec.Key))
	row("digest", rec.Digest())
	row("status", string(rec.Status))
	row("attempt", fmt.Sprint(rec.Attempt))
	row("payload hash", fmt.Sprintf("%s (%d bytes)", hex.EncodeToString(rec.PayloadHash), len(rec.PayloadHash)))
	switch {
	case rec.LeaseOwner == "" && rec.LeaseUntil.IsZero():
		row("lease", "none")
	default:
		l := "owner " + optional(rec.LeaseOwner)
		if !rec.LeaseUntil.IsZero() {
			l += ", until " + formatTime(rec.LeaseUntil)
		}
		row("lease", l+": "+leaseState(rec, now))
	}
	row("created", formatTime(rec.CreatedAt)+" ("+age(now, rec.CreatedAt)+" ago)")
	row("updated", formatTime(rec.UpdatedAt)+" ("+age(now, rec.UpdatedAt)+" ago)")
	switch {
	case rec.ExpiresAt.IsZero():
		row("expires", "never (kept forever)")
	case rec.ExpiresAt.Before(now):
		row("expires", formatTime(rec.ExpiresAt)+" ("+age(now, rec.ExpiresAt)+" ago"+purgeNote(rec)+")")
	default:
		row("expires", formatTime(rec.ExpiresAt)+" (in "+roundDuration(rec.ExpiresAt.Sub(now)).String()+")")
	}
	row("resource id", optional(rec.ResourceID))
	row("correlation id", optional(rec.CorrelationID))
	row("external ref", optional(rec.ExternalRef))
	row("error", optional(rec.Error))
	row("idempotency key", rec.IdempotencyKey())
	switch msgs, err := decodeOutput(rec.Result); {
	case len(rec.Result) == 0:
		row("output", "none")
	case err != nil:
		n := min(len(rec.Result), 16)
		row("output", fmt.Sprintf("%d bytes, %v (starts %x)", len(rec.Result), err, rec.Result[:n]))
	default:
		row("output", fmt.Sprintf("%d bytes: %d message(s) replayed to duplicates", len(rec.Result), len(msgs)))
		for n, m := range msgs {
			var md []string
			for _, k := range sortedKeys(m.Metadata) {
				md = append(md, text(k)+"="+text(m.Metadata[k]))
			}
			meta := "no metadata"
			if len(md) > 0 {
				meta = "metadata " + strings.Join(md, " ")
			}
			row(fmt.Sprintf("  message %d", n+1), fmt.Sprintf("uuid %s, payload %d bytes, %s", text(m.UUID), m.PayloadBytes, meta))
		}
	}
	_ = tw.Flush()

	if len(history) > 0 {
		fmt.Fprintln(w, "history (newest first):")
		for _, e := range history {
			fmt.Fprintf(w, "  %s  %s by %s: %s -> %s at attempt %d, reason %s\n", formatTime(e.At), e.Action, text(e.Actor),
				optional(string(e.StatusBefore)), optional(string(e.StatusAfter)), e.AttemptBefore, text(e.Reason))
		}
	}
	if hints := actionHints(rec, now, i.connFlags(a.db)); len(hints) > 0 {
		fmt.Fprintln(w, "what an operator can do (with the same --dsn):")
		for _, h := range hints {
			fmt.Fprintln(w, "  "+h)
		}
	}
}

func purgeNote(rec *inbox.Record) string {
	if rec.Status.Finished() {
		return "; the next purge deletes it"
	}
	return "; kept while unfinished"
}

// actionHints are the commands that apply to rec now: resolve for a
// pending record or a processing one whose lease expired, forget for
// anything not held by a live lease, wait for one that is.
func actionHints(rec *inbox.Record, now time.Time, conn string) []string {
	ids := conn + idArgs(rec.ID)
	at := fmt.Sprintf(" --attempt %d", rec.Attempt)
	var hints []string
	switch {
	case rec.Status == inbox.StatusProcessing && !rec.LeaseExpired(now):
		return []string{fmt.Sprintf("# held by %s for %s more: let the worker finish, or inspect again when the lease has expired",
			optional(rec.LeaseOwner), roundDuration(rec.LeaseUntil.Sub(now)))}
	case rec.Status == inbox.StatusPending || rec.Status == inbox.StatusProcessing:
		hints = append(hints,
			"# the effect happened (check with the provider, by the idempotency key above):",
			"inboxmill resolve"+ids+at+" --to completed --external-ref REF --reason '...'",
			"# it did not happen and must not be tried again:",
			"inboxmill resolve"+ids+at+" --to failed --reason '...'",
			"# it did not happen and the next delivery should run it again:")
	default:
		hints = append(hints, "# forget it so that the next delivery runs the handler again:")
	}
	return append(hints, "inboxmill forget"+ids+at+" --reason '...' --dry-run")
}
