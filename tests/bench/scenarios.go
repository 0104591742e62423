package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/internal/pipeline"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// plan is how one scenario delivers a message, built on a fresh fixture.
type plan struct {
	// deliver handles one message, as a router would call the handler chain.
	deliver message.HandlerFunc
	// duplicates: every message is delivered once, untimed, before the
	// measured run, which then only sees duplicates.
	duplicates bool
	// check runs after the measured run, in which (counting the warm-up)
	// total distinct events were delivered; it fails when an effect was lost
	// or doubled.
	check func(ctx context.Context, total int) error
	// note, when set, is logged after the check.
	note func() string
}

type scenario struct {
	name string
	plan func(ctx context.Context, f *fixture) (plan, error)
	// only, when set, is the one dialect the scenario runs on.
	only string
}

// perDialect are the scenarios measured per dialect and worker count. Each
// handler's effect is one INSERT of a business row.
var perDialect = []scenario{
	{"plain", planPlain, ""},
	// The ceiling of any inbox that adds a statement to the handler's
	// transaction, whatever that statement does.
	{"plain_stmt", planPlainStmt, ""},
	{"inboxmill", func(ctx context.Context, f *fixture) (plan, error) {
		return planInboxmill(ctx, f, false, dedup.ReadFirstAuto)
	}, ""},
	// Group commit: deliveries in flight share one claim statement and
	// one commit.
	{"inboxmill_group", planGroup, ""},
	// Group commit in pgx pipelines: the handler queues its INSERT, which
	// goes to the server with the group's COMMIT.
	{"inboxmill_group_pgx", planGroupPgx, "pg"},
	{"inboxmill_dup", func(ctx context.Context, f *fixture) (plan, error) {
		return planInboxmill(ctx, f, true, dedup.ReadFirstAuto)
	}, ""},
	// Duplicates that take the claim's transaction, as they do while fewer
	// than half of the recent deliveries are duplicates (ReadFirstAuto).
	{"inboxmill_dup_tx", func(ctx context.Context, f *fixture) (plan, error) {
		return planInboxmill(ctx, f, true, dedup.ReadFirstNever)
	}, ""},
	{"inboxmill_reserve", func(ctx context.Context, f *fixture) (plan, error) { return planReserve(ctx, f, nil) }, ""},
	// Reserve mode with batches: deliveries in flight share their
	// reservation statement and their completion statement.
	{"inboxmill_reserve_batch", func(ctx context.Context, f *fixture) (plan, error) {
		b := f.batch
		return planReserve(ctx, f, &b)
	}, ""},
	{"watermill_dedup", planWatermill, ""},
	{"select_then_insert", planSelectThenInsert, ""},
}

// measureScenario runs one scenario at one worker count on a fixture of
// its own: a warm-up (connections opened, statements prepared), the
// measured run, the check.
func (b *bench) measureScenario(ctx context.Context, d dialect, s scenario, workers int) (result, error) {
	f, err := b.newFixture(ctx, d, "bench", workers+2)
	if err != nil {
		return result{}, err
	}
	defer f.close()
	p, err := s.plan(ctx, f)
	if err != nil {
		return result{}, err
	}
	warm := newMessages(max(2*workers, 16), nil)
	msgs := newMessages(b.opts.msgs, nil)
	if p.duplicates {
		if err := deliverAll(ctx, workers, append(warm[:len(warm):len(warm)], msgs...), p.deliver); err != nil {
			return result{}, fmt.Errorf("first deliveries: %w", err)
		}
	}
	if err := deliverAll(ctx, workers, warm, p.deliver); err != nil {
		return result{}, fmt.Errorf("warm-up: %w", err)
	}
	// Duplicates need no steady load first (no limit adapts to them, and
	// the first deliveries above let ReadFirstAuto see them), and fresh
	// deliveries would make them fewer than every one.
	warmed := 0
	if !p.duplicates {
		if warmed, err = warmFor(ctx, workers, b.opts.warmup, p.deliver); err != nil {
			return result{}, err
		}
	}
	r, err := measure(ctx, workers, msgs, p.deliver, nil)
	if err != nil {
		return result{}, err
	}
	if err := p.check(ctx, len(warm)+warmed+len(msgs)); err != nil {
		return result{}, fmt.Errorf("check: %w", err)
	}
	if p.note != nil {
		b.logf("%s on %s with %d workers: %s", s.name, d.name, workers, p.note())
	}
	r.scenario, r.dialect = s.name, d.name
	return r, nil
}

// ownTx is the handler alone: its INSERT in a transaction of its own.
func (f *fixture) ownTx(msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, f.insert, eventID(msg), 100); err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	return nil, tx.Commit()
}

// inClaimTx is the handler under the dedup middleware's transactional
// mode: its INSERT in the claim's transaction.
func (f *fixture) inClaimTx(msg *message.Message) ([]*message.Message, error) {
	markClaimed(msg)
	tx, ok := dedup.TxFromContext(msg.Context())
	if !ok {
		return nil, errors.New("no transaction in the message's context")
	}
	_, err := tx.ExecContext(msg.Context(), f.insert, eventID(msg), 100)
	return nil, err
}

// autocommit is the handler under reserve mode: no transaction is open,
// and its INSERT stands in for an external effect.
func (f *fixture) autocommit(msg *message.Message) ([]*message.Message, error) {
	_, err := f.db.ExecContext(msg.Context(), f.insert, eventID(msg), 100)
	return nil, err
}

func planPlain(_ context.Context, f *fixture) (plan, error) {
	return plan{deliver: f.ownTx, check: func(ctx context.Context, total int) error {
		return f.expectRows(ctx, f.effects, total)
	}}, nil
}

// planPlainStmt is the handler alone plus one empty statement (SELECT 1)
// in its transaction before the INSERT: what one more statement costs, with
// no row written, no index touched, nothing to parse but a constant.
func planPlainStmt(_ context.Context, f *fixture) (plan, error) {
	deliver := func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, err := f.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		var one int
		if err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, f.insert, eventID(msg), 100); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		return nil, tx.Commit()
	}
	return plan{deliver: deliver, check: func(ctx context.Context, total int) error {
		return f.expectRows(ctx, f.effects, total)
	}}, nil
}

// dedupConfig is the middleware's configuration in every scenario: the
// event ID from metadata, the default canonical-JSON fingerprint, one scope,
// the default ReadFirst.
func dedupConfig(mode dedup.Mode) dedup.Config {
	return dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "bench", Mode: mode}
}

func planInboxmill(ctx context.Context, f *fixture, duplicates bool, readFirst dedup.ReadFirst) (plan, error) {
	store, err := f.newStore(ctx)
	if err != nil {
		return plan{}, err
	}
	cfg := dedupConfig(dedup.Transactional{ReadFirst: readFirst})
	d, err := dedup.New(store, cfg)
	if err != nil {
		return plan{}, err
	}
	return plan{deliver: d.Middleware(f.inClaimTx), duplicates: duplicates, check: func(ctx context.Context, total int) error {
		st := d.Stats()
		want := dedup.Stats{Executed: uint64(total)}
		if duplicates {
			want.Duplicates = uint64(total)
		}
		if st != want {
			return fmt.Errorf("middleware stats %+v, want %+v", st, want)
		}
		return f.expectRows(ctx, f.effects, total)
	}}, nil
}

// planGroup is planInboxmill with group commit on (the settings of
// --group-*, the library's defaults otherwise).
func planGroup(ctx context.Context, f *fixture) (plan, error) {
	return planGrouped(ctx, f, nil, f.inClaimTx)
}

// planGroupPgx is planGroup in pgx pipelines, with a handler that queues.
func planGroupPgx(ctx context.Context, f *fixture) (plan, error) {
	return planGrouped(ctx, f, pgxgroup.Pipeline(), f.queued)
}

func planGrouped(ctx context.Context, f *fixture, pipe pipeline.Opener, h message.HandlerFunc) (plan, error) {
	store, err := f.newStore(ctx)
	if err != nil {
		return plan{}, err
	}
	g := f.group
	g.Pipeline = pipe
	d, err := dedup.New(store, dedupConfig(dedup.Transactional{Group: &g}))
	if err != nil {
		return plan{}, err
	}
	return plan{deliver: d.Middleware(h), check: func(ctx context.Context, total int) error {
		if st := d.Stats(); st != (dedup.Stats{Executed: uint64(total)}) {
			return fmt.Errorf("middleware stats %+v, want %d executed", st, total)
		}
		return f.expectRows(ctx, f.effects, total)
	}, note: func() string {
		gs := d.GroupStats()
		return fmt.Sprintf("%d groups, %.1f members each, %d alone; coordinators %d (0: unbounded), %d trials, %d kept",
			gs.Groups, float64(gs.Members)/float64(max(gs.Groups, 1)), gs.Solo, gs.Coordinators, gs.Trials, gs.Kept)
	}}, nil
}

// queued is the handler in a pipelined group: its INSERT queued, sent
// with the group's COMMIT.
func (f *fixture) queued(msg *message.Message) ([]*message.Message, error) {
	markClaimed(msg)
	tx, ok := pgxgroup.FromContext(msg.Context())
	if !ok {
		return nil, errors.New("no group transaction in the message's context")
	}
	tx.Queue(f.insert, eventID(msg), 100)
	return nil, nil
}

func planReserve(ctx context.Context, f *fixture, batch *dedup.Batch) (plan, error) {
	store, err := f.newStore(ctx)
	if err != nil {
		return plan{}, err
	}
	d, err := dedup.New(store, dedupConfig(dedup.Reserve{Batch: batch}))
	if err != nil {
		return plan{}, err
	}
	p := plan{deliver: d.Middleware(f.autocommit), check: func(ctx context.Context, total int) error {
		if st := d.Stats(); st != (dedup.Stats{Executed: uint64(total)}) {
			return fmt.Errorf("middleware stats %+v, want %d executed", st, total)
		}
		return f.expectRows(ctx, f.effects, total)
	}}
	if batch != nil {
		p.note = func() string {
			bs := d.BatchStats()
			return fmt.Sprintf("%.1f reservations per statement, %.1f completions per statement; statements %d and %d (0: unbounded), %d trials, %d kept",
				float64(bs.Reservations)/float64(max(bs.ReserveBatches, 1)),
				float64(bs.Completions)/float64(max(bs.CompleteBatches, 1)),
				bs.ReserveStatements, bs.CompleteStatements, bs.Trials, bs.Kept)
		}
	}
	return p, nil
}

// planWatermill is Watermill's own Deduplicator, keyed on the same event ID,
// in front of the handler alone: an in-process map, forgotten on restart and
// not shared between consumers.
func planWatermill(_ context.Context, f *fixture) (plan, error) {
	repo, err := middleware.NewMapExpiringKeyRepository(time.Minute)
	if err != nil {
		return plan{}, err
	}
	d := &middleware.Deduplicator{
		KeyFactory: func(msg *message.Message) (string, error) { return eventID(msg), nil },
		Repository: repo,
		Timeout:    time.Minute,
	}
	return plan{deliver: d.Middleware(f.ownTx), check: func(ctx context.Context, total int) error {
		return f.expectRows(ctx, f.effects, total)
	}}, nil
}

// planSelectThenInsert is the deduplication people write by hand: in one
// transaction, look the key up; if absent, insert it and the business row.
// Two concurrent deliveries of one key both find it absent and one fails on
// the primary key — nothing is replayed, nothing refused on a changed
// payload — but it is the usual reference point.
func planSelectThenInsert(ctx context.Context, f *fixture) (plan, error) {
	processed := testdb.UniqueName("bench_processed")
	if err := f.exec(ctx, "CREATE TABLE "+processed+" (event_key VARCHAR(255) NOT NULL PRIMARY KEY)"); err != nil {
		return plan{}, err
	}
	f.tables = append(f.tables, processed)
	lookup := fmt.Sprintf("SELECT 1 FROM %s WHERE event_key = %s", processed, f.d.ph(1))
	record := fmt.Sprintf("INSERT INTO %s (event_key) VALUES (%s)", processed, f.d.ph(1))
	deliver := func(msg *message.Message) ([]*message.Message, error) {
		ctx, id := msg.Context(), eventID(msg)
		tx, err := f.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		var one int
		switch err := tx.QueryRowContext(ctx, lookup, id).Scan(&one); {
		case err == nil: // seen: ack without running
			return nil, tx.Rollback()
		case !errors.Is(err, sql.ErrNoRows):
			_ = tx.Rollback()
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, record, id); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, f.insert, id, 100); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		return nil, tx.Commit()
	}
	return plan{deliver: deliver, check: func(ctx context.Context, total int) error {
		if err := f.expectRows(ctx, processed, total); err != nil {
			return err
		}
		return f.expectRows(ctx, f.effects, total)
	}}, nil
}
