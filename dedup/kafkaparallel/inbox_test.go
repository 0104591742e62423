package kafkaparallel_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/kafkaparallel"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// variant is a way of running the dedup middleware behind the parallel
// subscriber: a database and driver, and a mode.
type variant struct {
	kind testdb.Kind
	mode string // tx, group, pipeline (group commit in pgx pipelines) or reserve
}

func (v variant) String() string { return string(v.kind) + "/" + v.mode }

// dbEnv is an inbox and an effects table on one database.
type dbEnv struct {
	t       *testing.T
	v       variant
	db      *sql.DB
	store   *inbox.Store
	effects string
	insert  string
	ctx     context.Context
}

func newDBEnv(t *testing.T, v variant) *dbEnv {
	t.Helper()
	db := testdb.Open(t, v.kind)
	dialect := testdb.Dialect(v.kind)
	e := &dbEnv{t: t, v: v, db: db, effects: testdb.UniqueName("kp_effects"), ctx: t.Context()}
	table := testdb.UniqueName("kp_inbox")
	store, err := inbox.NewStore(db, dialect, inbox.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(e.ctx))
	e.store = store
	// No unique constraint on purpose: an effect that happened twice is a
	// second row. The id follows the order effects were made in.
	id := "id BIGSERIAL PRIMARY KEY"
	switch v.kind {
	case testdb.MySQL:
		id = "id BIGINT AUTO_INCREMENT PRIMARY KEY"
	case testdb.SQLite:
		id = "id INTEGER PRIMARY KEY AUTOINCREMENT"
	}
	_, err = db.ExecContext(e.ctx, "CREATE TABLE "+e.effects+" ("+id+
		", event_id VARCHAR(64) NOT NULL, okey VARCHAR(64) NOT NULL, seq INT NOT NULL, consumer VARCHAR(16) NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, tbl := range append([]string{e.effects}, inbox.TableNames(table)...) {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})
	e.insert = fmt.Sprintf("INSERT INTO %s (event_id, okey, seq, consumer) VALUES (%s, %s, %s, %s)", e.effects,
		dialect.Placeholder(1), dialect.Placeholder(2), dialect.Placeholder(3), dialect.Placeholder(4))
	return e
}

// dedup returns a middleware of the variant's mode.
func (e *dbEnv) dedup() *dedup.Deduplicator {
	cfg := dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: handlerName}
	switch e.v.mode {
	case "group":
		cfg.Mode = dedup.Transactional{Group: &dedup.Group{}}
	case "pipeline":
		cfg.Mode = dedup.Transactional{Group: &dedup.Group{Pipeline: pgxgroup.Pipeline()}}
	case "reserve":
		cfg.Mode = dedup.Reserve{Lease: 5 * time.Second, InFlightWait: 100 * time.Millisecond, InFlightPoll: 10 * time.Millisecond}
	}
	d, err := dedup.New(e.store, cfg)
	require.NoError(e.t, err)
	return d
}

// handler makes the effect of a seqEvent the variant's way: a row in the
// claim's transaction, queued on the group's pipeline, or — in reserve
// mode, an effect outside the transaction — a row in autocommit. before,
// when set, runs first and can fail the delivery.
func (e *dbEnv) handler(consumer string, before func(ctx context.Context, ev seqEvent) error) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		ev := decodeSeq(e.t, msg)
		if before != nil {
			if err := before(ctx, ev); err != nil {
				return nil, err
			}
		}
		args := []any{msg.Metadata.Get("event_id"), ev.Key, ev.Seq, consumer}
		switch e.v.mode {
		case "pipeline":
			tx, ok := pgxgroup.FromContext(ctx)
			if !ok {
				return nil, errors.New("not in a pipelined group")
			}
			tx.Queue(e.insert, args...)
			return nil, nil
		case "reserve":
			_, err := e.db.ExecContext(ctx, e.insert, args...)
			return nil, err
		}
		tx, ok := dedup.TxFromContext(ctx)
		if !ok {
			return nil, errors.New("no transaction in the context")
		}
		_, err := tx.ExecContext(ctx, e.insert, args...)
		return nil, err
	}
}

func (e *dbEnv) countEffects() int {
	var n int
	require.NoError(e.t, e.db.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM "+e.effects).Scan(&n))
	return n
}

// checkEffects requires one effect per event of records, and each key's
// effects in sequence order.
func (e *dbEnv) checkEffects(events map[string]bool) {
	t := e.t
	rows, err := e.db.QueryContext(e.ctx, "SELECT event_id, okey, seq FROM "+e.effects+" ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	seen := map[string]int{}
	last := map[string]int{}
	var dups, unknown, disorder []string
	for rows.Next() {
		var id, key string
		var seq int
		require.NoError(t, rows.Scan(&id, &key, &seq))
		if seen[id]++; seen[id] == 2 {
			dups = append(dups, id)
		}
		if !events[id] {
			unknown = append(unknown, id)
		}
		if prev, ok := last[key]; ok && seq <= prev {
			disorder = append(disorder, fmt.Sprintf("%s: %d after %d", key, seq, prev))
		}
		last[key] = seq
	}
	require.NoError(t, rows.Err())
	var lost []string
	for id := range events {
		if seen[id] == 0 {
			lost = append(lost, id)
		}
	}
	sort.Strings(lost)
	require.Empty(t, dups, "events with more than one effect")
	require.Empty(t, lost, "events without an effect")
	require.Empty(t, unknown)
	require.Empty(t, disorder, "a key's effects out of sequence order")
}

// offsets records the offsets a consumer's router delivered, before the
// dedup middleware.
type offsets struct {
	mu  chan struct{}
	got map[int64]int
}

func newOffsets() *offsets { return &offsets{mu: make(chan struct{}, 1), got: map[int64]int{}} }

func (o *offsets) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if off, ok := kafkaOffset(msg); ok {
			o.mu <- struct{}{}
			o.got[off]++
			<-o.mu
		}
		return h(msg)
	}
}

func (o *offsets) snapshot() map[int64]int {
	o.mu <- struct{}{}
	defer func() { <-o.mu }()
	out := make(map[int64]int, len(o.got))
	for k, v := range o.got {
		out[k] = v
	}
	return out
}

func kafkaOffset(msg *message.Message) (int64, bool) {
	return kafkaparallel.MessagePartitionOffsetFromCtx(msg.Context())
}
