package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
)

// actorFlags are --actor and --reason, which every action takes: they go
// to the audit trail.
type actorFlags struct {
	actor, reason string
}

func (f *actorFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.actor, "actor", "", "who takes the action, for the audit trail (default the OS user)")
	cmd.Flags().StringVar(&f.reason, "reason", "", "why, for the audit trail (required)")
}

func (a *app) actorOf(f actorFlags) (inbox.Actor, error) {
	var errs []error
	if strings.TrimSpace(f.reason) == "" {
		errs = append(errs, errors.New("--reason is required: it is written to the audit trail"))
	} else if err := inbox.CheckText(f.reason, inbox.MaxReasonLen); err != nil {
		errs = append(errs, fmt.Errorf("--reason %w", err))
	}
	name := f.actor
	if name == "" {
		name = a.actorDefault()
	}
	if strings.TrimSpace(name) == "" {
		errs = append(errs, errors.New("--actor is required: there is no OS user name to default to"))
	} else if err := inbox.CheckText(name, inbox.MaxActorLen); err != nil {
		errs = append(errs, fmt.Errorf("--actor %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return inbox.Actor{}, usageErr(err)
	}
	return inbox.Actor{Name: name, Reason: f.reason}, nil
}

func (a *app) resolveCmd() *cobra.Command {
	var (
		id     idFlags
		act    actorFlags
		to     string
		p      inbox.ResolveParams
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "resolve (--operation NAME --key KEY [--scope SCOPE] | --digest HEX) --to completed|failed --reason TEXT",
		Short: "Move a pending record (or a processing one whose lease expired) to completed or failed",
		Long: `resolve settles a record whose outcome an operator has established: a pending
record (its effect may or may not have happened), or a processing record whose
lease has expired (its worker is gone). --to completed says the effect happened
(redeliveries are then acked as duplicates); --to failed says it did not and
must not be tried again. To have the next delivery run it again, forget it.

The change is fenced like a worker's: with --attempt (the attempt inspect
showed) it is refused when a worker took the record over since; it never
touches a record under a live lease. The record's state before, the actor and
the reason are written to the audit trail in the transaction of the change.
--dry-run does every check and changes nothing.`,
		Example: `  inboxmill resolve --digest 5f0c1a2b3c4d5e6f --attempt 1 --to completed \
    --external-ref ch_00042 --reason 'charge found in the provider dashboard'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			if err := id.check(cmd); err != nil {
				errs = append(errs, err)
			}
			switch p.To = inbox.Status(to); p.To {
			case inbox.StatusCompleted, inbox.StatusFailed:
			case "":
				errs = append(errs, errors.New("--to is required: completed (the effect happened) or failed (it did not, and must not be tried again)"))
			default:
				errs = append(errs, fmt.Errorf("--to %q: want completed or failed (to run it again, use inboxmill forget)", to))
			}
			if p.ExternalRef != "" && p.To == inbox.StatusFailed {
				errs = append(errs, errors.New("--external-ref is stored only with --to completed"))
			} else if err := inbox.CheckText(p.ExternalRef, inbox.MaxExternalRefLen); err != nil {
				errs = append(errs, fmt.Errorf("--external-ref %w", err))
			}
			if p.Error != "" && p.To == inbox.StatusCompleted {
				errs = append(errs, errors.New("--error is stored only with --to failed"))
			} else if err := inbox.CheckText(p.Error, inbox.MaxErrorLen); err != nil {
				errs = append(errs, fmt.Errorf("--error %w", err))
			}
			ctx := cmd.Context()
			i, rid, actor, err := a.startAction(ctx, errs, &id, act, p.Attempt)
			if err != nil {
				return err
			}
			defer i.Close()
			p.ID, p.Actor, p.DryRun = rid, actor, dryRun
			before, after, err := i.store.Resolve(ctx, p)
			if err != nil {
				return a.refusal(ctx, i, "resolve", p.ID, p.Attempt, err)
			}
			verb := "resolved"
			if dryRun {
				verb = "dry run: would resolve"
			}
			fmt.Fprintf(a.stdout, "%s %s (key %s): %s at attempt %d -> %s\n", verb, before.ID, text(before.Key),
				before.Status, before.Attempt, after.Status)
			if dryRun {
				fmt.Fprintln(a.stdout, "nothing changed; no audit entry written")
			} else {
				fmt.Fprintf(a.stdout, "audit: %s by %s, reason %s\n", "resolve", text(actor.Name), text(actor.Reason))
			}
			return nil
		},
	}
	id.add(cmd)
	act.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&to, "to", "", "completed (the effect happened) or failed (it did not, and must not be tried again)")
	fl.Int64Var(&p.Attempt, "attempt", 0, "the attempt you inspected: refused if a worker took the record over since (default the current one)")
	fl.StringVar(&p.ExternalRef, "external-ref", "", "the effect's reference at the provider (a charge ID), stored with --to completed")
	fl.StringVar(&p.Error, "error", "", "what went wrong, stored with --to failed")
	fl.BoolVar(&dryRun, "dry-run", false, "do every check, change nothing, write no audit entry")
	return cmd
}

func (a *app) forgetCmd() *cobra.Command {
	var (
		id     idFlags
		act    actorFlags
		p      inbox.ForgetParams
		dryRun bool
		yes    bool
	)
	cmd := &cobra.Command{
		Use:   "forget (--operation NAME --key KEY [--scope SCOPE] | --digest HEX) --reason TEXT",
		Short: "Delete one record, so that its next delivery runs the handler again",
		Long: `forget deletes one record: the deliberate "run it again". The next delivery of
its key claims it anew and runs the handler (with the same idempotency key, so
a provider that deduplicates still sees one intent). It refuses a processing
record under a live lease: its worker may still finish it. With --attempt it
is refused when the record moved to another attempt since you inspected it.

The record as it was, the actor and the reason are written to the audit trail
in the transaction of the delete. --dry-run shows what it would delete and
changes nothing.

On a terminal it shows the record and asks before deleting it, and the
delete then applies only to the attempt it showed; --yes goes ahead
without asking (for scripts). Without --yes, when standard input is not a
terminal, it refuses (exit 2).`,
		Example: `  inboxmill forget --operation ship_order --key evt-42 --attempt 2 --reason 'carrier lost the parcel' --dry-run`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			if err := id.check(cmd); err != nil {
				errs = append(errs, err)
			}
			if !dryRun {
				if err := a.mayAsk(cmd, yes); err != nil {
					errs = append(errs, err)
				}
			}
			ctx := cmd.Context()
			i, rid, actor, err := a.startAction(ctx, errs, &id, act, p.Attempt)
			if err != nil {
				return err
			}
			defer i.Close()
			p.ID, p.Actor, p.DryRun = rid, actor, dryRun
			if !dryRun && !yes {
				// Show what would go, fenced like the delete, and delete
				// only the attempt the operator was shown.
				check := p
				check.DryRun = true
				rec, err := i.store.Forget(ctx, check)
				if err != nil {
					return a.refusal(ctx, i, "forget", p.ID, p.Attempt, err)
				}
				if err := a.confirm(ctx, fmt.Sprintf("forget %s (key %s), %s at attempt %d? Its next delivery runs the handler again.",
					rec.ID, text(rec.Key), rec.Status, rec.Attempt)); err != nil {
					return err
				}
				p.Attempt = rec.Attempt
			}
			rec, err := i.store.Forget(ctx, p)
			if err != nil {
				return a.refusal(ctx, i, "forget", p.ID, p.Attempt, err)
			}
			if dryRun {
				fmt.Fprintf(a.stdout, "dry run: would forget %s (key %s), %s at attempt %d\n", rec.ID, text(rec.Key), rec.Status, rec.Attempt)
				fmt.Fprintln(a.stdout, "nothing changed; no audit entry written")
				return nil
			}
			fmt.Fprintf(a.stdout, "forgot %s (key %s), %s at attempt %d: its next delivery runs the handler again\n",
				rec.ID, text(rec.Key), rec.Status, rec.Attempt)
			fmt.Fprintf(a.stdout, "audit: %s by %s, reason %s\n", "forget", text(actor.Name), text(actor.Reason))
			return nil
		},
	}
	id.add(cmd)
	act.add(cmd)
	cmd.Flags().Int64Var(&p.Attempt, "attempt", 0, "the attempt you inspected: refused if the record moved on since (default the current one)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show what would be deleted, change nothing, write no audit entry")
	addYesFlag(cmd, &yes)
	return cmd
}

// startAction does what resolve and forget share before they act: it
// adds the checks of --attempt and the actor to the usage errors found so
// far (errs), and reports them all at once; then it opens the inbox and
// finds the record's ID. The caller closes the inbox.
func (a *app) startAction(ctx context.Context, errs []error, id *idFlags, act actorFlags, attempt int64) (
	*inboxDB, inbox.ID, inbox.Actor, error,
) {
	if attempt < 0 {
		errs = append(errs, fmt.Errorf("--attempt %d: want the attempt inspect showed, or 0 for the current one", attempt))
	}
	actor, err := a.actorOf(act)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, inbox.ID{}, inbox.Actor{}, usageErr(err)
	}
	i, err := openInbox(ctx, a.db, existing, true)
	if err != nil {
		return nil, inbox.ID{}, inbox.Actor{}, err
	}
	rid, err := a.recordID(ctx, i, id)
	if err != nil {
		i.Close()
		return nil, inbox.ID{}, inbox.Actor{}, err
	}
	return i, rid, actor, nil
}

// recordID resolves the flags to an ID: a digest is looked up first.
func (a *app) recordID(ctx context.Context, i *inboxDB, id *idFlags) (inbox.ID, error) {
	if id.digest == "" {
		return id.id(), nil
	}
	rec, err := id.find(ctx, i, a.stderr)
	if err != nil {
		return inbox.ID{}, err
	}
	return rec.ID, nil
}

// refusal turns the store's refusal of an action into a message that says
// what the record is now and what to do; other errors pass through. The
// message says what the store's error would, so it is shown instead of
// that error's chain, which stays underneath for errors.Is.
func (a *app) refusal(ctx context.Context, i *inboxDB, action string, id inbox.ID, attempt int64, err error) error {
	now := func() *inbox.Record {
		rec, gerr := i.store.Get(ctx, i.db, id)
		if gerr != nil {
			return nil
		}
		return rec
	}
	shown := func(format string, args ...any) error {
		return &shownError{msg: fmt.Sprintf(format, args...), err: err}
	}
	switch {
	case errors.Is(err, inbox.ErrNotFound):
		// Found by digest a moment ago, or named by key: gone either way.
		return &shownError{msg: fmt.Sprintf("%s: %s in table %s has scope %s, operation %s and key %s (digest %s): "+
			"there is nothing to %s (someone forgot it, or the purge deleted it)", action, errNoRecord, i.table,
			text(id.Scope), text(id.Operation), text(id.Key), id.Digest(), action), err: errors.Join(errNoRecord, err)}
	case errors.Is(err, inbox.ErrLeaseLost):
		rec := now()
		if rec != nil && attempt != 0 && rec.Attempt < attempt {
			// Attempts only grow: no worker moved the record down to its
			// attempt. The operator mistyped, or the record seen at
			// attempt was forgotten and its key claimed anew since.
			return refusedErr(shown("refused to %s %s: it is %s, not %d: no worker took it over "+
				"(attempts only grow); check --attempt against inspect (if inspect showed attempt %d, the record was "+
				"forgotten and claimed anew since)", action, id, recordState(rec, i.store.Now()), attempt, attempt))
		}
		msg := fmt.Sprintf("refused to %s %s: it is no longer at attempt %d", action, id, attempt)
		if attempt == 0 {
			msg = fmt.Sprintf("refused to %s %s: it moved on while being changed", action, id)
		}
		if rec != nil {
			msg += ": a worker took it over, it is " + recordState(rec, i.store.Now())
		}
		return refusedErr(shown("%s; inspect it again before acting", msg))
	case errors.Is(err, inbox.ErrLeaseLive):
		msg := fmt.Sprintf("refused to %s %s: a worker holds it under a live lease", action, id)
		if rec := now(); rec != nil {
			msg += fmt.Sprintf(" (%s, %s)", optional(rec.LeaseOwner), leaseState(rec, i.store.Now()))
		}
		return refusedErr(shown("%s; let it finish, or try again once the lease has expired", msg))
	case errors.Is(err, inbox.ErrNotResolvable):
		msg := fmt.Sprintf("refused to %s %s", action, id)
		if rec := now(); rec != nil {
			msg += fmt.Sprintf(": it is %s", rec.Status)
		}
		return refusedErr(shown("%s; only pending records, and processing ones whose lease expired, can be resolved "+
			"(to run a finished one again, forget it)", msg))
	case errors.Is(err, inbox.ErrInvalidParams), errors.Is(err, inbox.ErrInvalidKey):
		return usageErr(shown("%s", invalidReasons(err)))
	}
	return i.target.scrub(err)
}

// invalidReasons returns what the store found wrong with parameters it
// refused with ErrInvalidParams: the reasons it joined under the
// sentinel, without the "inbox: resolve: inbox: invalid parameters: "
// they are wrapped in. The flags are checked before the store is called,
// so this is a backstop; err's text is used when the chain has no such
// reasons.
func invalidReasons(err error) string {
	for e := err; e != nil; {
		if multi, ok := e.(interface{ Unwrap() []error }); ok {
			var reasons []string
			found := false
			for _, c := range multi.Unwrap() {
				if c == inbox.ErrInvalidParams {
					found = true
				} else if c != nil {
					reasons = append(reasons, strings.ReplaceAll(c.Error(), "\n", "; "))
				}
			}
			if found && len(reasons) > 0 {
				return strings.Join(reasons, "; ")
			}
			return err.Error()
		}
		e = errors.Unwrap(e)
	}
	return err.Error()
}

// recordState renders a record's status and attempt for a refusal, with
// its lease while it is processing: "pending at attempt 1", "processing at
// attempt 2 (live, 59m left)".
func recordState(rec *inbox.Record, now time.Time) string {
	s := fmt.Sprintf("%s at attempt %d", rec.Status, rec.Attempt)
	if rec.Status == inbox.StatusProcessing {
		s += " (" + leaseState(rec, now) + ")"
	}
	return s
}
