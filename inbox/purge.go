package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inboxmill/inboxmill/internal/service"
)

// PurgeParams are the inputs of [Store.Purge].
type PurgeParams struct {
	// Before: records whose expires_at is earlier are deleted. Defaults to
	// the store's current time. A time before the year 1 or after 9999 is
	// taken as that bound (no record expires outside it), which every
	// database's time column holds.
	Before time.Time
	// BatchSize is how many records one statement deletes. Each batch is
	// its own short transaction, so concurrent claims wait at most for one
	// batch. Defaults to DefaultPurgeBatchSize.
	BatchSize int
	// MaxBatches bounds one call. Defaults to 0: until nothing is left.
	MaxBatches int
	// Pause is a rest between batches, so that writers queued behind a
	// batch get the database before the next one (SQLite has no lock
	// queue: a purge that never rests starves them). Defaults to as long as
	// the previous batch took, which gives the purge at most half of the
	// write time; -1 rests not at all.
	Pause time.Duration
	// Audit, when set, records the run in the audit table as one entry
	// (action "purge") by this actor: each batch then runs in a
	// transaction that also inserts the entry (the first batch) or updates
	// its count to the running total (later ones), so that however the run
	// ends — finished, cancelled between batches, failed — the entry counts
	// exactly the records its committed batches deleted. A run that
	// deletes nothing changed nothing and writes no entry. An unusable
	// actor is refused with [ErrInvalidParams] before anything is deleted.
	Audit *Actor
	// Progress, when set, is called after each committed batch with the
	// totals so far, on the goroutine that called Purge.
	Progress func(PurgeResult)
}

// PurgeResult reports what [Store.Purge] did.
type PurgeResult struct {
	// Deleted counts the records deleted, those of dropped partitions
	// included.
	Deleted int64
	Batches int
	// Partitions counts the partitions dropped (partitioned tables only).
	Partitions int
	// AuditID is the run's audit entry (PurgeParams.Audit); "" when none
	// was written: without Audit, or when nothing was deleted.
	AuditID string
}

// Purge deletes expired completed and failed records in batches. It never
// deletes processing or pending records, whatever their expires_at: their
// outcome is not settled yet. A purged key is forgotten; a later delivery
// of it runs again, which is why retention must outlast every redelivery
// and replay horizon.
func (s *Store) Purge(ctx context.Context, p PurgeParams) (PurgeResult, error) {
	if p.Audit != nil {
		if err := invalidParams("purge", p.Audit.check()); err != nil {
			return PurgeResult{}, err
		}
	}
	if p.Before.IsZero() {
		p.Before = s.now()
	}
	p.Before = storableTime(p.Before)
	if p.BatchSize <= 0 {
		p.BatchSize = DefaultPurgeBatchSize
	}
	var r PurgeResult
	if s.parts != nil {
		// Whole partitions first: what is left in the rest is what the
		// batches then delete.
		if err := s.dropPartitions(ctx, p, &r); err != nil {
			return r, withCtxErr(ctx, err)
		}
	}
	for p.MaxBatches <= 0 || r.Batches < p.MaxBatches {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		start := time.Now()
		var (
			n   int64
			err error
		)
		if p.Audit == nil {
			n, err = s.purgeBatch(ctx, s.db, p)
		} else {
			n, err = s.auditedPurgeBatch(ctx, p, &r)
		}
		if err != nil {
			return r, withCtxErr(ctx, err)
		}
		r.Batches++
		r.Deleted += n
		if p.Progress != nil {
			p.Progress(r)
		}
		if n < int64(p.BatchSize) {
			break
		}
		pause := p.Pause
		if pause == 0 {
			pause = time.Since(start)
		}
		if pause > 0 {
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-time.After(pause):
			}
		}
	}
	return r, nil
}

// purgeBatch deletes one batch through q.
func (s *Store) purgeBatch(ctx context.Context, q DBTX, p PurgeParams) (int64, error) {
	res, err := s.exec(ctx, q, s.q.purge, &params{before: p.Before, limit: p.BatchSize})
	if err != nil {
		return 0, fmt.Errorf("inbox: purge: %w", s.Classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("inbox: purge: rows affected: %w", s.Classify(err))
	}
	return n, nil
}

// auditedPurgeBatch deletes one batch in a transaction that also writes
// the run's audit entry: inserted by the first batch that deletes
// anything (r.AuditID is then set), its count updated by later ones that
// deleted anything.
func (s *Store) auditedPurgeBatch(ctx context.Context, p PurgeParams, r *PurgeResult) (_ int64, err error) {
	tx, err := s.db.BeginTx(txContext(ctx), nil)
	if err != nil {
		return 0, fmt.Errorf("inbox: purge: begin: %w", s.Classify(err))
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	n, err := s.purgeBatch(ctx, tx, p)
	if err != nil {
		return 0, err
	}
	id, err := s.auditPurge(ctx, tx, p, r, n)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("inbox: purge: commit: %w", withCtxErr(ctx, s.Classify(err)))
	}
	r.AuditID = id
	return n, nil
}

// auditPurge writes, in tx, the run's audit entry with r.Deleted + n
// records (a dropped partition's count included): it inserts it when r
// has none yet, and updates its count otherwise; while nothing has been
// deleted it writes nothing. It returns the entry's ID ("" while there is
// none), for r.AuditID once tx commits.
func (s *Store) auditPurge(ctx context.Context, tx *sql.Tx, p PurgeParams, r *PurgeResult, n int64) (_ string, err error) {
	id := r.AuditID
	switch {
	case id == "" && r.Deleted+n == 0:
		return "", nil // nothing changed: nothing to account for
	case id == "":
		now := s.now()
		id = newAuditID(now)
		_, err = s.exec(ctx, tx, s.q.insertAudit, &params{now: now, audit: auditParams{
			id: id, actor: p.Audit.Name, action: ActionPurge, reason: p.Audit.Reason, affected: r.Deleted + n,
		}})
	case n > 0:
		var res sql.Result
		res, err = s.exec(ctx, tx, s.q.updateAuditCount, &params{audit: auditParams{id: id, affected: r.Deleted + n}})
		if err == nil {
			// The count changes, so even MySQL without CLIENT_FOUND_ROWS
			// counts the row.
			if m, rerr := res.RowsAffected(); rerr != nil {
				err = rerr
			} else if m != 1 {
				err = fmt.Errorf("the audit entry %s is gone", id)
			}
		}
	}
	if err != nil {
		return "", fmt.Errorf("inbox: purge: audit: %w", s.Classify(err))
	}
	return id, nil
}

// DefaultPurgeBatchSize is PurgeParams.BatchSize's default.
const DefaultPurgeBatchSize = 1000

// DefaultPurgeInterval is PurgerConfig.Interval's default.
const DefaultPurgeInterval = time.Minute

// PurgerConfig configures a [Purger].
type PurgerConfig struct {
	// Interval between purges. Defaults to DefaultPurgeInterval (1 minute).
	Interval time.Duration
	// BatchSize is passed to Store.Purge. Defaults to DefaultPurgeBatchSize.
	BatchSize int
	// Logger receives one Info line per purge that deleted something, and
	// errors. Defaults to a logger that discards everything.
	Logger *slog.Logger
	// OnPurge, when set, is called after every purge (for metrics).
	OnPurge func(PurgeResult, error)
}

// Purger runs [Store.Purge] on an interval: [Purger.Run] blocks until its
// context ends, [Purger.Start] runs it in a goroutine of its own until
// [Purger.Close]. It can run again after it stopped.
type Purger struct {
	store *Store
	cfg   PurgerConfig
	loop  service.Loop
}

// NewPurger returns a purger for store. It starts nothing.
func NewPurger(store *Store, cfg PurgerConfig) (*Purger, error) {
	var errs []error
	if store == nil {
		errs = append(errs, fmt.Errorf("%w: store is nil", ErrInvalidConfig))
	}
	if cfg.Interval < 0 {
		errs = append(errs, fmt.Errorf("%w: Interval %v is negative", ErrInvalidConfig, cfg.Interval))
	}
	if cfg.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("%w: BatchSize %d is negative", ErrInvalidConfig, cfg.BatchSize))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultPurgeInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Purger{store: store, cfg: cfg}, nil
}

// Run purges now and then every Interval until ctx ends or Close is
// called; it returns nil then. Running twice at once is an error.
func (p *Purger) Run(ctx context.Context) error {
	return wrapRunning(p.loop.Run(ctx, p.cfg.Interval, p.pass))
}

// Start is Run in a goroutine of its own, until Close.
func (p *Purger) Start() error {
	return wrapRunning(p.loop.Start(p.cfg.Interval, p.pass))
}

// Running returns a channel that is closed while the purger runs.
func (p *Purger) Running() <-chan struct{} { return p.loop.Running() }

// Close stops the purger and waits for a purge under way to end. It is
// safe to call more than once, and on a purger never started.
func (p *Purger) Close() error { return p.loop.Close() }

func wrapRunning(err error) error {
	if errors.Is(err, service.ErrRunning) {
		return fmt.Errorf("inbox: purger %w", err)
	}
	return err
}

func (p *Purger) pass(ctx context.Context) {
	res, err := p.store.Purge(ctx, PurgeParams{BatchSize: p.cfg.BatchSize})
	if ctx.Err() != nil {
		return
	}
	attrs := []any{"table", p.store.Table(), "deleted", res.Deleted, "batches", res.Batches}
	switch {
	case err != nil:
		p.cfg.Logger.Error("inboxmill: purge failed", append(attrs, "error", err.Error())...)
	case res.Deleted > 0:
		p.cfg.Logger.Info("inboxmill: purged expired records", attrs...)
	}
	if p.cfg.OnPurge != nil {
		p.cfg.OnPurge(res, err)
	}
}
