package dedup_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// bigOutput is the size of the output that MariaDB's default
// max_allowed_packet (16 MiB) cannot take in one statement.
const bigOutput = 20 << 20

// outputCase is one database with a middleware over a table of its own, a
// business table the handler writes an effect to, and a handler whose
// output has the size the test asks for.
type outputCase struct {
	kind    testdb.Kind
	db      *sql.DB
	store   *inbox.Store
	d       *dedup.Deduplicator
	log     *testkit.Logger
	reg     *prometheus.Registry
	effects string
	calls   atomic.Int64
	size    int
}

func newOutputCase(t *testing.T, kind testdb.Kind, cfg inbox.Config, mode dedup.Mode) *outputCase {
	t.Helper()
	c := &outputCase{kind: kind, db: testdb.Open(t, kind), log: testkit.NewLogger(), reg: prometheus.NewRegistry(),
		effects: inboxtest.UniqueTable("effects")}
	c.store = inboxtest.NewStore(t, c.db, testdb.Dialect(kind), cfg)
	_, err := c.db.Exec(fmt.Sprintf("CREATE TABLE %s (event_id VARCHAR(64) NOT NULL)", c.effects))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = c.db.Exec("DROP TABLE " + c.effects) })
	c.d, err = dedup.New(c.store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "export",
		Logger: c.log, Registerer: c.reg, Mode: mode})
	require.NoError(t, err)
	return c
}

// handler writes one effect — in the claim's transaction, or on its own in
// reserve mode — and returns one message whose payload is c.size bytes.
func (c *outputCase) handler() message.HandlerFunc {
	return c.d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		c.calls.Add(1)
		var q inbox.DBTX = c.db
		if tx, ok := dedup.TxFromContext(msg.Context()); ok {
			q = tx
		}
		_, err := q.ExecContext(msg.Context(), fmt.Sprintf("INSERT INTO %s (event_id) VALUES (%s)",
			c.effects, c.store.Dialect().Placeholder(1)), msg.Metadata.Get("event_id"))
		if err != nil {
			return nil, err
		}
		payload := bytes.Repeat([]byte("x"), c.size)
		return []*message.Message{message.NewMessage("out-"+msg.Metadata.Get("event_id"), payload)}, nil
	})
}

func (c *outputCase) effectsOf(t *testing.T, key string) int {
	t.Helper()
	var n int
	require.NoError(t, c.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE event_id = %s",
		c.effects, c.store.Dialect().Placeholder(1)), key).Scan(&n))
	return n
}

func (c *outputCase) record(t *testing.T, key string) *inbox.Record {
	t.Helper()
	rec, err := c.store.Get(context.Background(), c.db, inbox.ID{Operation: "export", Key: key})
	require.NoError(t, err)
	return rec
}

func exportMsg(key string) *message.Message {
	msg := message.NewMessage("delivery-"+key, []byte(`{"report":"`+key+`"}`))
	msg.Metadata.Set("event_id", key)
	return msg
}

// dropLines are the lines saying an output was dropped.
func (c *outputCase) dropLines() []testkit.LogEntry {
	var out []testkit.LogEntry
	for _, e := range c.log.At("info") {
		if strings.Contains(e.Msg, "output too large to store") {
			out = append(out, e)
		}
	}
	return out
}

// requireDropped checks a delivery of key whose output was too large: it
// completed on the first delivery with one effect, the record has no
// result, the drop was logged (digest, size, limit — not the payload) and
// counted, and a duplicate is acked without running the handler and
// without output.
func (c *outputCase) requireDropped(t *testing.T, h message.HandlerFunc, key string) {
	t.Helper()
	out, err := h(exportMsg(key))
	require.NoError(t, err, "the first delivery completes")
	require.Len(t, out, 1, "the first delivery still hands its output to the router")
	require.Len(t, out[0].Payload, c.size)
	require.Equal(t, int64(1), c.calls.Load())
	require.Equal(t, 1, c.effectsOf(t, key))
	rec := c.record(t, key)
	require.Equal(t, inbox.StatusCompleted, rec.Status)
	require.Nil(t, rec.Result)

	lines := c.dropLines()
	require.Len(t, lines, 1)
	f := lines[0].Fields
	require.Equal(t, rec.Digest(), f["key_digest"])
	require.Greater(t, f["output_bytes"], c.size)
	limit, err := c.store.ResultLimit(context.Background(), c.db)
	require.NoError(t, err)
	require.Equal(t, limit, f["limit_bytes"])
	require.Less(t, len(lines[0].String()), 4096, "the line does not carry the output")

	st := c.d.Stats()
	require.Equal(t, uint64(1), st.Executed)
	require.Equal(t, uint64(1), st.OutputsDropped)
	require.Equal(t, 1.0, counterSum(t, c.reg, "inboxmill_dedup_outputs_dropped_total", "operation", "export"))

	dup, err := h(exportMsg(key))
	require.NoError(t, err, "the duplicate is acked")
	require.Empty(t, dup, "there is no stored output to replay")
	require.Equal(t, int64(1), c.calls.Load(), "the duplicate did not run the handler")
	require.Equal(t, 1, c.effectsOf(t, key))
	require.Equal(t, uint64(1), c.d.Stats().Duplicates)
}

// requireStored checks that an output under the limit is stored and
// replayed to a duplicate, byte for byte.
func (c *outputCase) requireStored(t *testing.T, h message.HandlerFunc, key string) {
	t.Helper()
	before, dropped := c.calls.Load(), len(c.dropLines())
	out, err := h(exportMsg(key))
	require.NoError(t, err)
	require.Len(t, out, 1)
	require.NotNil(t, c.record(t, key).Result)
	dup, err := h(exportMsg(key))
	require.NoError(t, err)
	require.Len(t, dup, 1, "the duplicate replays the stored output")
	require.Equal(t, out[0].UUID, dup[0].UUID)
	require.Equal(t, []byte(out[0].Payload), []byte(dup[0].Payload))
	require.Equal(t, before+1, c.calls.Load())
	require.Equal(t, 1, c.effectsOf(t, key))
	require.Len(t, c.dropLines(), dropped, "nothing more was dropped")
}

// TestOutputTooLargeToStoreCompletesWithoutIt: on MariaDB (default
// max_allowed_packet) a 20 MiB output would make the server close the
// connection, losing the claim's transaction at every delivery. It is
// dropped before it is sent instead, on the first delivery. PostgreSQL and
// SQLite store 20 MiB; there the same happens over Config.MaxResult.
func TestOutputTooLargeToStoreCompletesWithoutIt(t *testing.T) {
	for _, kind := range testdb.All {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			cfg := inbox.Config{}
			if kind != testdb.MySQL {
				cfg.MaxResult = 4 << 20
			}
			c := newOutputCase(t, kind, cfg, nil)
			h := c.handler()
			c.size = bigOutput
			c.requireDropped(t, h, "big")
			c.size = 1 << 10
			c.requireStored(t, h, "small")
		})
	}
}

// TestOutputOverHalfThePacketIsStored: on MariaDB an output between half
// of max_allowed_packet and the whole packet (10 MiB at the default 16
// MiB) is bound as a statement parameter, which takes it: it is stored
// and replayed to a duplicate, in both modes, not dropped.
func TestOutputOverHalfThePacketIsStored(t *testing.T) {
	modes := map[string]dedup.Mode{"transactional": nil, "reserve": dedup.Reserve{InFlightPoll: 5 * time.Millisecond}}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newOutputCase(t, testdb.MySQL, inbox.Config{}, mode)
			var packet int
			require.NoError(t, c.db.QueryRow("SELECT @@max_allowed_packet").Scan(&packet))
			c.size = packet/2 + packet/8
			c.requireStored(t, c.handler(), "over-half")
		})
	}
}

// TestOutputUnderTheDatabasesLimitIsStored: without Config.MaxResult,
// PostgreSQL and SQLite store and replay a 20 MiB output.
func TestOutputUnderTheDatabasesLimitIsStored(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.SQLite, testdb.PostgresPQ, testdb.PostgresPGX} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			c := newOutputCase(t, kind, inbox.Config{}, nil)
			c.size = bigOutput
			c.requireStored(t, c.handler(), "big")
		})
	}
}

// TestOutputTooLargeToStoreInAJoinedTransaction: joined to a consuming
// transaction, the drop leaves that transaction usable; the effect and
// the record commit with it.
func TestOutputTooLargeToStoreInAJoinedTransaction(t *testing.T) {
	t.Parallel()
	var tx atomic.Pointer[sql.Tx]
	c := newOutputCase(t, testdb.MySQL, inbox.Config{}, dedup.Transactional{
		JoinTx: func(context.Context) (*sql.Tx, bool) { t := tx.Load(); return t, t != nil },
	})
	h := c.handler()
	inTx := func(msg *message.Message) ([]*message.Message, error) {
		t.Helper()
		ctx := context.Background()
		consuming, err := c.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		reg := dedup.RegisterConsumingTx(consuming)
		tx.Store(consuming)
		defer tx.Store(nil)
		out, err := h(msg)
		if err != nil || !reg.End() {
			_ = consuming.Rollback()
			return nil, err
		}
		return out, consuming.Commit()
	}
	c.size = bigOutput
	c.requireDropped(t, inTx, "big")
}

// TestOutputTooLargeToStoreInReserveMode: reserve mode drops the output up
// front and completes the record in one write.
func TestOutputTooLargeToStoreInReserveMode(t *testing.T) {
	t.Parallel()
	c := newOutputCase(t, testdb.MySQL, inbox.Config{}, dedup.Reserve{InFlightPoll: 5 * time.Millisecond})
	h := c.handler()
	c.size = bigOutput
	c.requireDropped(t, h, "big")
	c.size = 1 << 10
	c.requireStored(t, h, "small")
}
