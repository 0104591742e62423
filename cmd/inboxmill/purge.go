package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
)

func (a *app) purgeCmd() *cobra.Command {
	var (
		act      actorFlags
		p        inbox.PurgeParams
		pause    time.Duration
		dryRun   bool
		progress bool
		yes      bool
	)
	cmd := &cobra.Command{
		Use:   "purge --reason TEXT",
		Short: "Delete the completed and failed records past their expires_at, in batches, with a progress bar",
		Long: `purge deletes completed and failed records whose expires_at has passed, in
batches of --batch-size, each its own short transaction, resting between
batches so that the workers' claims get the database. It never deletes
processing or pending records. A purged key is forgotten: a later delivery of
it runs again, which is why retention must outlast every redelivery and replay.

Ctrl-C stops it after the batch under way: what was deleted stays deleted,
and running purge again goes on from there (a second Ctrl-C ends it at once).
The run is written to the audit trail with its running count. --dry-run
counts what a purge would delete and changes nothing.

On a partitioned PostgreSQL table (found by looking at it) purge first drops
the partitions whose buckets closed --partition-retention after they ended
and whose records have all expired, then deletes what is left in batches.
Pass the --partition-width and --partition-retention its stores run with.

On a terminal it counts what it would delete and asks before deleting, and
then deletes only what had expired when it counted; --yes goes ahead
without asking (for scripts). Without --yes, when standard input is not a
terminal, it refuses (exit 2). When nothing has expired it deletes nothing
and writes no audit entry.`,
		Example: `  inboxmill purge --reason 'backlog after the purger was down' --batch-size 5000
  inboxmill purge --dry-run --reason check
  inboxmill purge --yes --reason nightly --progress=false   # from cron`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			actor, err := a.actorOf(act)
			if err != nil {
				errs = append(errs, err)
			}
			if p.BatchSize < 1 || p.MaxBatches < 0 {
				errs = append(errs, errors.New("--batch-size must be at least 1 and --max-batches at least 0"))
			}
			if !dryRun {
				if err := a.mayAsk(cmd, yes); err != nil {
					errs = append(errs, err)
				}
			}
			if err := errors.Join(errs...); err != nil {
				return usageErr(err)
			}
			ask := !dryRun && !yes
			ctx := cmd.Context()
			i, err := openInbox(ctx, a.db, existing, true)
			if err != nil {
				return err
			}
			defer i.Close()
			// The count is for the dry run's answer and the bar's length:
			// without either, a purge of a large table need not count it.
			var ov inbox.Overview
			if dryRun || progress || ask {
				if ov, err = i.store.Overview(ctx); err != nil {
					return err
				}
			}
			if dryRun {
				fmt.Fprintf(a.stdout, "dry run: a purge would delete %s from table %s (completed and failed, past expires_at",
					plural(ov.AwaitingPurge, "record"), i.table)
				if t, ok := oldestExpired(ov); ok {
					fmt.Fprintf(a.stdout, "; the oldest expired %s ago", age(ov.Now, t))
				}
				fmt.Fprintln(a.stdout, ")")
				fmt.Fprintln(a.stdout, "nothing changed; no audit entry written")
				return nil
			}
			if ask {
				if ov.AwaitingPurge == 0 {
					fmt.Fprintf(a.stdout, "nothing to purge: no completed or failed record of table %s is past expires_at; "+
						"no audit entry written\n", i.table)
					return nil
				}
				q := fmt.Sprintf("purge %s from table %s (completed and failed, past expires_at",
					plural(ov.AwaitingPurge, "record"), i.table)
				if t, ok := oldestExpired(ov); ok {
					q += fmt.Sprintf("; the oldest expired %s ago", age(ov.Now, t))
				}
				if err := a.confirm(ctx, q+")? Their keys are forgotten: a later delivery of one runs the handler again."); err != nil {
					return err
				}
				// What was counted and confirmed, not what expired since.
				p.Before = ov.Now
			}
			return a.purge(ctx, i, p, actor, pause, progress, ov.AwaitingPurge)
		},
	}
	act.add(cmd)
	fl := cmd.Flags()
	fl.IntVar(&p.BatchSize, "batch-size", inbox.DefaultPurgeBatchSize, "records one batch deletes")
	fl.IntVar(&p.MaxBatches, "max-batches", 0, "stop after this many batches (0: until nothing expired is left)")
	fl.DurationVar(&pause, "pause", 0, "rest between batches (default: as long as the batch took; negative: none)")
	fl.BoolVar(&dryRun, "dry-run", false, "count what would be deleted, change nothing, write no audit entry")
	fl.BoolVar(&progress, "progress", true, "show a progress bar on standard error")
	addYesFlag(cmd, &yes)
	return cmd
}

// purge runs the purge so that an interrupt (ctx ending) stops it between
// batches: the batches run under a context the interrupt does not cancel,
// and the rests between them, taken here, end early and stop the purge.
func (a *app) purge(ctx context.Context, i *inboxDB, p inbox.PurgeParams, actor inbox.Actor, pause time.Duration,
	progress bool, total int64,
) error {
	var bar *progressbar.ProgressBar
	if progress && total > 0 {
		bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(a.stderr),
			progressbar.OptionSetDescription("purging "+i.table),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("records"),
			progressbar.OptionShowIts(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(a.stderr) }),
		)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	var (
		last        inbox.PurgeResult
		batchStart  = time.Now()
		interrupted bool
	)
	p.Audit = &actor
	p.Pause = -1
	p.Progress = func(r inbox.PurgeResult) {
		took := time.Since(batchStart)
		n := r.Deleted - last.Deleted
		last = r
		if bar != nil {
			if r.Deleted > total {
				total = r.Deleted
				bar.ChangeMax64(total)
			}
			_ = bar.Set64(r.Deleted)
		}
		if n < int64(p.BatchSize) || (p.MaxBatches > 0 && r.Batches >= p.MaxBatches) {
			return // the last batch
		}
		rest := pause
		if rest == 0 {
			rest = took
		}
		if rest > 0 {
			t := time.NewTimer(rest)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			interrupted = true
			stop()
		}
		batchStart = time.Now()
	}
	res, err := i.store.Purge(runCtx, p)
	if bar != nil {
		if err == nil && !interrupted {
			_ = bar.Finish()
		} else {
			_ = bar.Exit()
		}
	}
	switch {
	case interrupted && (err == nil || errors.Is(err, context.Canceled)):
		fmt.Fprintf(a.stdout, "interrupted after %s: purged %s from table %s; run purge again to go on\n",
			plural(int64(res.Batches), "batch"), plural(res.Deleted, "record"), i.table)
		return &exitError{exitInterrupted, fmt.Errorf("interrupted; %s purged", plural(res.Deleted, "record"))}
	case err != nil:
		return fmt.Errorf("purge stopped after %s (%s purged): %w", plural(int64(res.Batches), "batch"),
			plural(res.Deleted, "record"), i.target.scrub(err))
	}
	if res.Deleted == 0 {
		fmt.Fprintf(a.stdout, "nothing to purge: no completed or failed record of table %s is past expires_at; "+
			"no audit entry written\n", i.table)
		return nil
	}
	if res.Partitions > 0 {
		fmt.Fprintf(a.stdout, "purged %s from table %s: %s dropped, then %s\n", plural(res.Deleted, "record"), i.table,
			plural(int64(res.Partitions), "partition"), plural(int64(res.Batches), "batch"))
	} else {
		fmt.Fprintf(a.stdout, "purged %s from table %s in %s\n", plural(res.Deleted, "record"), i.table,
			plural(int64(res.Batches), "batch"))
	}
	fmt.Fprintf(a.stdout, "audit: purge by %s, reason %s\n", text(actor.Name), text(actor.Reason))
	return nil
}
