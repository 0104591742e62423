package galera

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	driver "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/deduptest"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/mysql"
)

// scale multiplies the number of events of each test:
// INBOXMILL_GALERA_SCALE, default 1 (about a minute and a half in all on
// two cores).
func scale() int {
	if v, err := strconv.Atoi(os.Getenv("INBOXMILL_GALERA_SCALE")); err == nil && v > 0 {
		return v
	}
	return 1
}

// syncWait is the DSN parameter that makes every read of a session wait
// until the node has applied every transaction the cluster committed
// before it: causal reads across nodes. The driver sends unknown DSN
// parameters as SET on each new connection.
const syncWait = "wsrep_sync_wait=1"

// TestGalera starts one cluster and runs every scenario on it, the node
// kill last.
func TestGalera(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Galera cluster (about a minute); not in -short mode")
	}
	c := startCluster(t)
	t.Run("Conformance", func(t *testing.T) { testConformance(t, c) })
	t.Run("TwoNodesTransactional", func(t *testing.T) { testTwoNodesTransactional(t, c) })
	t.Run("TwoNodesReserve", func(t *testing.T) {
		t.Run("SyncWait", func(t *testing.T) { testTwoNodesReserve(t, c, syncWait) })
		t.Run("NoSyncWait", func(t *testing.T) { testTwoNodesReserve(t, c) })
	})
	t.Run("ReserveRetryIsBounded", func(t *testing.T) { testReserveRetryIsBounded(t, c) })
	t.Run("CausalReads", func(t *testing.T) { testCausalReads(t, c) })
	t.Run("ReserveFencing", func(t *testing.T) { testReserveFencing(t, c) })
	t.Run("ConcurrentMigrate", func(t *testing.T) { testConcurrentMigrate(t, c) })
	t.Run("Partitioned", func(t *testing.T) { testPartitioned(t, c) })
	t.Run("NodeKilled", func(t *testing.T) { testNodeKilled(t, c) })
}

// testConformance runs the store's and the middleware's suites on node 1.
func testConformance(t *testing.T, c *cluster) {
	db := c.open(t, 1)
	db.SetMaxOpenConns(20)
	db.SetMaxIdleConns(20)
	open := func(testing.TB) *sql.DB { return db }
	t.Run("Store", func(t *testing.T) {
		inboxtest.Run(t, inboxtest.Harness{Dialect: mysql.Dialect(), DB: open})
	})
	t.Run("Dedup", func(t *testing.T) {
		deduptest.Run(t, deduptest.Harness{Dialect: mysql.Dialect(), DB: open})
	})
}

// mysqlCode is the server error number in err's chain, or 0.
func mysqlCode(err error) uint16 {
	var me *driver.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// tables creates an inbox table (migrated through node 1) and a business
// table, and waits until both exist on every node given.
type tables struct {
	inbox, effects string
}

func newTables(t *testing.T, c *cluster, nodes ...int) tables {
	t.Helper()
	tb := tables{inbox: inboxtest.UniqueTable("inbox"), effects: inboxtest.UniqueTable("effects")}
	db1 := c.open(t, 1)
	s, err := inbox.NewStore(db1, mysql.Dialect(), inbox.Config{Table: tb.inbox})
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Migrate(context.Background()))
	// Galera replicates InnoDB tables that have a primary key; the
	// business table gets one, and no unique key on event_id, so that a
	// second effect would show up as a second row.
	_, err = db1.Exec("CREATE TABLE " + tb.effects + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, " +
		"event_id VARCHAR(64) NOT NULL, node INT NOT NULL, KEY (event_id)) ENGINE = InnoDB")
	require.NoError(t, err)
	for _, n := range nodes {
		waitTables(t, c, n, tb.inbox, tb.effects)
	}
	return tb
}

// waitTables reads the tables on node n with a causal read, so that the
// DDL of node 1 is known to be applied there.
func waitTables(t *testing.T, c *cluster, n int, names ...string) {
	t.Helper()
	db := c.open(t, n, syncWait)
	for _, name := range names {
		var cnt int
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+name).Scan(&cnt), "node %d: table %s", n, name)
	}
	_ = db.Close()
}

// effectCounts returns the number of business rows per event, read on
// node n causally, and which node wrote each.
func effectCounts(t *testing.T, c *cluster, n int, table string) (counts map[string]int, by map[string]int) {
	t.Helper()
	db := c.open(t, n, syncWait)
	defer db.Close()
	rows, err := db.Query("SELECT event_id, node FROM " + table)
	require.NoError(t, err)
	defer rows.Close()
	counts, by = map[string]int{}, map[string]int{}
	for rows.Next() {
		var ev string
		var nd int
		require.NoError(t, rows.Scan(&ev, &nd))
		counts[ev]++
		by[ev] = nd
	}
	require.NoError(t, rows.Err())
	return counts, by
}

// rendezvous makes the handlers of one event on two nodes wait for each
// other (up to a bound), so that both transactions have inserted the same
// key locally before either commits: the case only certification decides.
type rendezvous struct {
	mu sync.Mutex
	ch map[string]chan struct{}
	n  map[string]int
}

func newRendezvous() *rendezvous {
	return &rendezvous{ch: map[string]chan struct{}{}, n: map[string]int{}}
}

// meet returns when the other party arrived or after wait.
func (r *rendezvous) meet(key string, wait time.Duration) {
	r.mu.Lock()
	ch := r.ch[key]
	if ch == nil {
		ch = make(chan struct{})
		r.ch[key] = ch
	}
	r.n[key]++
	if r.n[key] == 2 {
		close(ch)
	}
	r.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(wait):
	}
}

// clusterCounters sums wsrep_local_cert_failures and wsrep_local_bf_aborts
// over the nodes given.
func clusterCounters(t *testing.T, c *cluster, nodes ...int) (cert, bf int64) {
	t.Helper()
	for _, n := range nodes {
		cert += c.nodes[n-1].statusInt(t, "wsrep_local_cert_failures")
		bf += c.nodes[n-1].statusInt(t, "wsrep_local_bf_aborts")
	}
	return cert, bf
}

// nackPhase names the statement a nacked transactional delivery failed in.
func nackPhase(err error, ran bool) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "dedup: commit"):
		return "commit"
	case strings.Contains(msg, "store output"):
		return "store output"
	case ran:
		return "handler's statement"
	default:
		return "claim (after ClaimAttempts)"
	}
}

func eventID(i int) string { return fmt.Sprintf("evt-%05d", i) }

func payloadOf(msgs []*message.Message) string {
	if len(msgs) != 1 {
		return fmt.Sprintf("<%d messages>", len(msgs))
	}
	return string(msgs[0].Payload)
}

// testTwoNodesTransactional delivers every event at the same moment through
// the transactional middleware on node 1 and on node 2.
func testTwoNodesTransactional(t *testing.T, c *cluster) {
	tb := newTables(t, c, 2)
	events := 500 * scale()
	const op = "galera_effect"
	var runs atomic.Int64
	rv := newRendezvous()
	ds := make([]*dedup.Deduplicator, 2)
	handlers := make([]message.HandlerFunc, 2)
	for i := range 2 {
		db := c.open(t, i+1)
		s, err := inbox.NewStore(db, mysql.Dialect(), inbox.Config{Table: tb.inbox})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		d, err := dedup.New(s, dedup.Config{Key: dedup.KeyFromMetadata(deduptest.EventIDKey), Operation: op,
			Mode: dedup.Transactional{}})
		require.NoError(t, err)
		ds[i] = d
		node := i + 1
		handlers[i] = d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			runs.Add(1)
			msg.Metadata.Set("ran", "1")
			tx, ok := dedup.TxFromContext(msg.Context())
			if !ok {
				return nil, errors.New("no transaction in the handler's context")
			}
			ev := msg.Metadata.Get(deduptest.EventIDKey)
			if _, err := tx.ExecContext(msg.Context(), "INSERT INTO "+tb.effects+" (event_id, node) VALUES (?, ?)",
				ev, node); err != nil {
				return nil, err
			}
			if msg.Metadata.Get("meet") == "1" {
				rv.meet(ev, 250*time.Millisecond)
			}
			return []*message.Message{message.NewMessage(watermill.NewUUID(),
				[]byte(fmt.Sprintf("%s done by node %d", ev, node)))}, nil
		})
	}
	cert0, bf0 := clusterCounters(t, c, 1, 2)

	type result struct {
		node   int
		out    string
		err    error
		retryN int // redeliveries until acked
	}
	var (
		mu          sync.Mutex
		results     = map[string][]result{}
		firstNacks  = map[uint16]int{}
		retryNacks  = map[uint16]int{}
		notRetry    []error
		wg          sync.WaitGroup
		sem         = make(chan struct{}, 8)
		meetEvents  int
		retriedRuns int
		phases      = map[string]int{}
	)
	for i := range events {
		ev := eventID(i)
		meet := i%2 == 0 // half the events make both handlers overlap; the other half race freely
		if meet {
			meetEvents++
		}
		payload := fmt.Sprintf(`{"event":%q,"n":%d}`, ev, i)
		start := make(chan struct{})
		sem <- struct{}{}
		var pair sync.WaitGroup
		for k := range 2 {
			pair.Add(1)
			wg.Go(func() {
				defer pair.Done()
				msg := deduptest.NewMessage(ev, payload)
				if meet {
					msg.Metadata.Set("meet", "1")
				}
				<-start
				out, err := handlers[k](msg)
				r := result{node: k + 1, out: payloadOf(out), err: err}
				if err != nil {
					mu.Lock()
					firstNacks[mysqlCode(err)]++
					phases[nackPhase(err, msg.Metadata.Get("ran") != "")]++
					if !inbox.IsRetryable(err) {
						notRetry = append(notRetry, err)
					}
					mu.Unlock()
					// Redeliver the nacked message, as the broker does, until
					// it is acked.
					for r.retryN = 1; r.retryN <= 20; r.retryN++ {
						again := msg.Copy()
						delete(again.Metadata, "ran")
						out, err = handlers[k](again)
						if again.Metadata.Get("ran") != "" {
							mu.Lock()
							retriedRuns++
							mu.Unlock()
						}
						if err == nil {
							r.out, r.err = payloadOf(out), nil
							break
						}
						mu.Lock()
						retryNacks[mysqlCode(err)]++
						if !inbox.IsRetryable(err) {
							notRetry = append(notRetry, err)
						}
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
					}
					if err != nil {
						r.err = err
					}
				}
				mu.Lock()
				results[ev] = append(results[ev], r)
				mu.Unlock()
			})
		}
		close(start)
		go func() { pair.Wait(); <-sem }()
	}
	wg.Wait()
	cert1, bf1 := clusterCounters(t, c, 1, 2)

	require.Empty(t, notRetry, "every nack must be retryable")
	counts, by := effectCounts(t, c, 1, tb.effects)
	var (
		winners   [3]int
		bothAcked int
		lostFirst int
	)
	for i := range events {
		ev := eventID(i)
		rs := results[ev]
		require.Len(t, rs, 2, ev)
		require.Equal(t, 1, counts[ev], "%s: exactly one effect", ev)
		want := fmt.Sprintf("%s done by node %d", ev, by[ev])
		for _, r := range rs {
			require.NoError(t, r.err, "%s: node %d never acked", ev, r.node)
			// The loser's redelivery is a duplicate: the winner's stored
			// output, not a second run of its own.
			require.Equal(t, want, r.out, "%s: delivery through node %d", ev, r.node)
			if r.retryN > 0 {
				lostFirst++
			}
		}
		winners[by[ev]]++
		if rs[0].retryN == 0 && rs[1].retryN == 0 {
			bothAcked++
		}
	}
	s1, s2 := ds[0].Stats(), ds[1].Stats()
	require.EqualValues(t, events, s1.Executed+s2.Executed, "one execution per event")
	total := 0
	for _, n := range firstNacks {
		total += n
	}
	t.Logf("transactional, 2 nodes: %d events (%d with overlapping handlers), 2 deliveries each: "+
		"%d effects, none duplicated; winners node1=%d node2=%d; handler runs %d (%d in redeliveries, all rolled back)",
		events, meetEvents, len(counts), winners[1], winners[2], runs.Load(), retriedRuns)
	t.Logf("first deliveries nacked: %d (by MySQL error: %v; where: %v), all retryable; redeliveries nacked again: %v; "+
		"events where both first deliveries acked (one a duplicate): %d; deliveries acked only after redelivery: %d",
		total, firstNacks, phases, retryNacks, bothAcked, lostFirst)
	t.Logf("server counters on nodes 1+2: wsrep_local_cert_failures +%d, wsrep_local_bf_aborts +%d; "+
		"stats node1 %+v node2 %+v", cert1-cert0, bf1-bf0, s1, s2)
	require.Positive(t, firstNacks[1213], "no certification failure surfaced: the test did not race the nodes")
}
