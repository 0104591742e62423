package dedup_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// BenchmarkMiddleware measures, per database, the handler alone in its own
// transaction (plain: the baseline and the physical limit), the middleware
// on fresh events, and the middleware on duplicates: with the default
// TracerProvider (no provider installed, so no spans), and traced by an SDK
// provider that records every span and exports none, which is the
// instrumentation's own cost.
func BenchmarkMiddleware(b *testing.B) {
	for _, kind := range testdb.All {
		b.Run(string(kind), func(b *testing.B) {
			b.Run("plain", func(b *testing.B) { benchPlain(b, kind) })
			b.Run("fresh", func(b *testing.B) { benchDedup(b, kind, false, nil) })
			b.Run("duplicate", func(b *testing.B) { benchDedup(b, kind, true, nil) })
			b.Run("fresh_traced", func(b *testing.B) { benchDedup(b, kind, false, sdktrace.NewTracerProvider()) })
			b.Run("duplicate_traced", func(b *testing.B) { benchDedup(b, kind, true, sdktrace.NewTracerProvider()) })
		})
	}
}

type benchEnv struct {
	db      *sql.DB
	dialect inbox.Dialect
	effects string
	insert  string
}

func setupBench(b *testing.B, kind testdb.Kind) *benchEnv {
	b.Helper()
	db := testdb.Open(b, kind)
	e := &benchEnv{db: db, dialect: testdb.Dialect(kind), effects: testdb.UniqueName("bench_effects")}
	_, err := db.Exec("CREATE TABLE " + e.effects + " (event_id VARCHAR(255) NOT NULL, amount INTEGER NOT NULL)")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + e.effects) })
	e.insert = fmt.Sprintf("INSERT INTO %s (event_id, amount) VALUES (%s, %s)", e.effects,
		e.dialect.Placeholder(1), e.dialect.Placeholder(2))
	return e
}

func (e *benchEnv) write(ctx context.Context, tx *sql.Tx, id string) error {
	_, err := tx.ExecContext(ctx, e.insert, id, 100)
	return err
}

func benchPlain(b *testing.B, kind testdb.Kind) {
	e := setupBench(b, kind)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := e.write(ctx, tx, "evt-"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

func benchDedup(b *testing.B, kind testdb.Kind, duplicate bool, tp *sdktrace.TracerProvider) {
	e := setupBench(b, kind)
	table := testdb.UniqueName("bench_inbox")
	store, err := inbox.NewStore(e.db, e.dialect, inbox.Config{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, t := range inbox.TableNames(table) {
			_, _ = e.db.Exec("DROP TABLE IF EXISTS " + t)
		}
	})
	cfg := dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "bench"}
	if tp != nil {
		cfg.TracerProvider = tp
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	}
	d, err := dedup.New(store, cfg)
	if err != nil {
		b.Fatal(err)
	}
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := dedup.TxFromContext(msg.Context())
		return nil, e.write(msg.Context(), tx, msg.Metadata.Get("event_id"))
	})
	payload := []byte(`{"order_id":"o-1","amount":100,"currency":"EUR","sent_at":"2026-11-30T12:00:00Z"}`)
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set("event_id", "evt-dup")
	if duplicate {
		if _, err := h(msg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if !duplicate {
			msg.Metadata.Set("event_id", "evt-"+strconv.Itoa(i))
		}
		if _, err := h(msg); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	st := d.Stats()
	want := uint64(b.N)
	if duplicate && st.Duplicates != want || !duplicate && st.Executed != want {
		b.Fatalf("stats %+v after %d deliveries", st, b.N)
	}
}
