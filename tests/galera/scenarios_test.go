package galera

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/deduptest"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/mysql"
)

// nackKind names why a delivery was nacked, for the logs.
func nackKind(err error) string {
	switch {
	case mysqlCode(err) != 0:
		return fmt.Sprintf("mysql %d", mysqlCode(err))
	case errors.Is(err, dedup.ErrInFlight):
		return "in flight"
	case errors.Is(err, inbox.ErrLeaseLost), errors.Is(err, dedup.ErrLeaseLost):
		return "lease lost"
	case inbox.IsRetryable(err):
		return "transient"
	default:
		return "other"
	}
}

// testTwoNodesReserve delivers every event at the same moment through the
// reserve-mode middleware on node 1 and on node 2, the handler counting its
// runs as the external effect. params are the DSN parameters of both
// nodes' pools.
func testTwoNodesReserve(t *testing.T, c *cluster, params ...string) {
	tb := newTables(t, c, 2)
	events := 300 * scale()
	var (
		mu   sync.Mutex
		runs = map[string]int{}
	)
	handlers := make([]message.HandlerFunc, 2)
	ds := make([]*dedup.Deduplicator, 2)
	for i := range 2 {
		db := c.open(t, i+1, params...)
		s, err := inbox.NewStore(db, mysql.Dialect(), inbox.Config{Table: tb.inbox})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		d, err := dedup.New(s, dedup.Config{Key: dedup.KeyFromMetadata(deduptest.EventIDKey), Operation: "galera_call",
			Mode: dedup.Reserve{Lease: 20 * time.Second, InFlightWait: 20 * time.Second, InFlightPoll: 5 * time.Millisecond,
				Owner: fmt.Sprintf("node%d", i+1)}})
		require.NoError(t, err)
		ds[i] = d
		node := i + 1
		handlers[i] = d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			ev := msg.Metadata.Get(deduptest.EventIDKey)
			mu.Lock()
			runs[ev]++
			mu.Unlock()
			time.Sleep(10 * time.Millisecond) // the external call
			return []*message.Message{message.NewMessage(watermill.NewUUID(),
				[]byte(fmt.Sprintf("%s called by node %d", ev, node)))}, nil
		})
	}
	cert0, bf0 := clusterCounters(t, c, 1, 2)
	var (
		nacks        = map[string]int{}
		outs         = map[string][]string{}
		wg           sync.WaitGroup
		sem          = make(chan struct{}, 8)
		pending      []error
		notRetryable []error
	)
	for i := range events {
		ev := eventID(i)
		payload := fmt.Sprintf(`{"event":%q}`, ev)
		start := make(chan struct{})
		sem <- struct{}{}
		var pair sync.WaitGroup
		for k := range 2 {
			pair.Add(1)
			wg.Go(func() {
				defer pair.Done()
				msg := deduptest.NewMessage(ev, payload)
				<-start
				var (
					out []*message.Message
					err error
				)
				for try := 0; try < 50; try++ {
					out, err = handlers[k](msg.Copy())
					if err == nil {
						break
					}
					mu.Lock()
					nacks[nackKind(err)]++
					if !dedup.IsRetryable(err) {
						notRetryable = append(notRetryable, err)
					}
					mu.Unlock()
					time.Sleep(10 * time.Millisecond)
				}
				mu.Lock()
				if err != nil {
					pending = append(pending, fmt.Errorf("%s via node %d: %w", ev, k+1, err))
				}
				outs[ev] = append(outs[ev], payloadOf(out))
				mu.Unlock()
			})
		}
		close(start)
		go func() { pair.Wait(); <-sem }()
	}
	wg.Wait()
	cert1, bf1 := clusterCounters(t, c, 1, 2)
	require.Empty(t, pending, "deliveries never acked")
	require.Empty(t, notRetryable, "every nack is retryable")
	// The losing reservation's certification failure is retried in place
	// (inbox.ReserveAttempts): the delivery then reads the winner's record
	// and waits for its outcome instead of being nacked and redelivered.
	require.Zero(t, nacks["mysql 1213"], "reservations nacked with 1213 (nacks: %v)", nacks)

	s1, err := inbox.NewStore(c.open(t, 1, syncWait), mysql.Dialect(), inbox.Config{Table: tb.inbox})
	require.NoError(t, err)
	defer s1.Close()
	var winners [3]int
	for i := range events {
		ev := eventID(i)
		require.Equal(t, 1, runs[ev], "%s: exactly one handler run", ev)
		rec, err := s1.Get(context.Background(), s1.DB(), inbox.ID{Operation: "galera_call", Key: ev})
		require.NoError(t, err)
		require.Equal(t, inbox.StatusCompleted, rec.Status, ev)
		require.EqualValues(t, 1, rec.Attempt, "%s: never taken over", ev)
		require.Len(t, outs[ev], 2)
		require.Equal(t, outs[ev][0], outs[ev][1], "%s: both deliveries return the one output", ev)
		if strings.HasSuffix(outs[ev][0], "node 1") {
			winners[1]++
		} else {
			winners[2]++
		}
	}
	st1, st2 := ds[0].Stats(), ds[1].Stats()
	require.EqualValues(t, events, st1.Executed+st2.Executed)
	mode := "wsrep_sync_wait=0"
	if len(params) > 0 {
		mode = strings.Join(params, "&")
	}
	t.Logf("reserve, 2 nodes, %s: %d events, 2 concurrent deliveries each: handler runs = %d (one per event); "+
		"winners node1=%d node2=%d; nacks before the ack: %v; duplicates acked: %d; "+
		"wsrep_local_cert_failures +%d, wsrep_local_bf_aborts +%d",
		mode, events, events, winners[1], winners[2], nacks, st1.Duplicates+st2.Duplicates, cert1-cert0, bf1-bf0)
}

// testReserveRetryIsBounded reserves a key whose row another transaction
// on the same node holds (a transactional claim, not committed) through a
// session whose lock wait times out after a second: every attempt fails
// transiently, and Reserve gives up after inbox.ReserveAttempts statements
// with a retryable error, for the delivery to be nacked.
func testReserveRetryIsBounded(t *testing.T, c *cluster) {
	tb := newTables(t, c)
	ctx := context.Background()
	id := inbox.ID{Operation: "galera_bounded", Key: "held"}
	holderStore, err := inbox.NewStore(c.open(t, 1), mysql.Dialect(), inbox.Config{Table: tb.inbox})
	require.NoError(t, err)
	defer holderStore.Close()
	holder, err := holderStore.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback() }()
	claimed, err := holderStore.Claim(ctx, holder, inbox.ClaimParams{ID: id, PayloadHash: []byte("h")})
	require.NoError(t, err)
	require.True(t, claimed.Claimed)

	// One connection, so that its session counters count the store's
	// statements.
	db := c.open(t, 1, "innodb_lock_wait_timeout=1")
	db.SetMaxOpenConns(1)
	s, err := inbox.NewStore(db, mysql.Dialect(), inbox.Config{Table: tb.inbox})
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.SyncClock(ctx))
	inserts := func() int {
		var name string
		var n int
		require.NoError(t, db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_insert'").Scan(&name, &n))
		return n
	}
	before := inserts()
	start := time.Now()
	_, err = s.Reserve(ctx, inbox.ReserveParams{ID: id, PayloadHash: []byte("h"), Owner: "node1", Lease: time.Minute})
	took := time.Since(start)
	sent := inserts() - before
	require.Error(t, err)
	require.True(t, inbox.IsRetryable(err), "a lock wait timeout is transient: %v", err)
	require.EqualValues(t, 1205, mysqlCode(err), "%v", err)
	require.Equal(t, inbox.ReserveAttempts, sent, "the reservation statement is sent a bounded number of times")
	t.Logf("reservation behind a held row, innodb_lock_wait_timeout=1: %d statements in %v, then %v",
		sent, took.Round(10*time.Millisecond), err)

	require.NoError(t, holder.Rollback())
	res, err := s.Reserve(ctx, inbox.ReserveParams{ID: id, PayloadHash: []byte("h"), Owner: "node1", Lease: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, res.Lease, "free again, the key is reserved")
}

// testReserveFencing lets a lease taken on node 1 expire while its handler
// still runs; a delivery through node 2 takes the intent over, and the
// zombie's completion through node 1 must be refused.
func testReserveFencing(t *testing.T, c *cluster) {
	tb := newTables(t, c, 2)
	const keys = 3
	type run struct {
		node    int
		attempt int64
		idem    string
	}
	var (
		mu   sync.Mutex
		runs = map[string][]run{}
	)
	handlers := make([]message.HandlerFunc, 2)
	for i := range 2 {
		s, err := inbox.NewStore(c.open(t, i+1, syncWait), mysql.Dialect(), inbox.Config{Table: tb.inbox})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		d, err := dedup.New(s, dedup.Config{Key: dedup.KeyFromMetadata(deduptest.EventIDKey), Operation: "galera_fence",
			Mode: dedup.Reserve{Lease: time.Second, HeartbeatInterval: -1, InFlightWait: 10 * time.Second,
				InFlightPoll: 20 * time.Millisecond, Owner: fmt.Sprintf("node%d", i+1)}})
		require.NoError(t, err)
		node := i + 1
		handlers[i] = d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			cl, _ := dedup.ClaimFromContext(msg.Context())
			mu.Lock()
			runs[cl.Key] = append(runs[cl.Key], run{node: node, attempt: cl.Attempt, idem: cl.IdempotencyKey})
			mu.Unlock()
			if node == 1 {
				time.Sleep(2500 * time.Millisecond) // outlives its one-second lease
			}
			return []*message.Message{message.NewMessage(watermill.NewUUID(),
				[]byte(fmt.Sprintf("%s called by node %d", cl.Key, node)))}, nil
		})
	}
	var wg sync.WaitGroup
	zombie := make([]error, keys)
	taker := make([]error, keys)
	again := make([]string, keys)
	for i := range keys {
		ev := eventID(i)
		msg := deduptest.NewMessage(ev, `{}`)
		wg.Go(func() {
			_, zombie[i] = handlers[0](msg.Copy())
			// The broker redelivers the zombie's nacked message.
			out, err := handlers[0](msg.Copy())
			again[i] = payloadOf(out)
			if err != nil {
				again[i] = err.Error()
			}
		})
		wg.Go(func() {
			time.Sleep(200 * time.Millisecond) // node 1 reserves first
			_, taker[i] = handlers[1](msg.Copy())
		})
	}
	wg.Wait()
	for i := range keys {
		ev := eventID(i)
		require.NoError(t, taker[i], "%s: node 2 takes the expired lease over", ev)
		require.ErrorIs(t, zombie[i], inbox.ErrLeaseLost, "%s: node 1's late completion is fenced", ev)
		require.Equal(t, fmt.Sprintf("%s called by node 2", ev), again[i], "%s: the record holds node 2's outcome", ev)
		rs := runs[ev]
		require.Len(t, rs, 2, ev)
		require.Equal(t, run{node: 1, attempt: 1, idem: rs[0].idem}, rs[0])
		require.Equal(t, run{node: 2, attempt: 2, idem: rs[0].idem}, rs[1], "same idempotency key, next attempt")
	}
	t.Logf("fencing across nodes: %d keys; lease (1 s) taken on node 1 expired while its handler ran; node 2 took "+
		"over as attempt 2; node 1's completion refused (%v); redelivery through node 1 returned node 2's output",
		keys, nackKind(zombie[0]))
}

// testConcurrentMigrate runs Store.Migrate on node 1 and node 2 at the same
// moment for fresh tables, then through one node only.
func testConcurrentMigrate(t *testing.T, c *cluster) {
	db1, db2 := c.open(t, 1, syncWait), c.open(t, 2, syncWait)
	ctx := context.Background()

	// GET_LOCK is node-local: both nodes grant the same lock at once.
	conn1, err := db1.Conn(ctx)
	require.NoError(t, err)
	defer conn1.Close()
	conn2, err := db2.Conn(ctx)
	require.NoError(t, err)
	defer conn2.Close()
	var got1, got2 int
	require.NoError(t, conn1.QueryRowContext(ctx, "SELECT COALESCE(GET_LOCK('inboxmill:galera_probe', 0), 0)").Scan(&got1))
	require.NoError(t, conn2.QueryRowContext(ctx, "SELECT COALESCE(GET_LOCK('inboxmill:galera_probe', 0), 0)").Scan(&got2))
	require.Equal(t, 1, got1)
	require.Equal(t, 1, got2, "GET_LOCK is not cluster-wide on Galera")
	_, _ = conn1.ExecContext(ctx, "DO RELEASE_LOCK('inboxmill:galera_probe')")
	_, _ = conn2.ExecContext(ctx, "DO RELEASE_LOCK('inboxmill:galera_probe')")

	rounds := 6 * scale()
	migrate := func(dbs [2]*sql.DB) (errs [2]error, table string) {
		table = inboxtest.UniqueTable("mig")
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, db := range dbs {
			s, err := inbox.NewStore(db, mysql.Dialect(), inbox.Config{Table: table})
			require.NoError(t, err)
			defer s.Close()
			wg.Go(func() { <-start; errs[i] = s.Migrate(ctx) })
		}
		close(start)
		wg.Wait()
		return errs, table
	}
	check := func(table string) {
		// Whatever the race did, Migrate through either node now succeeds
		// and changes nothing, and the schema is the newest.
		for _, db := range []*sql.DB{db1, db2} {
			s, err := inbox.NewStore(db, mysql.Dialect(), inbox.Config{Table: table})
			require.NoError(t, err)
			require.NoError(t, s.Migrate(ctx), "%s: migrate again", table)
			_ = s.Close()
		}
		var versions []int
		rows, err := db1.QueryContext(ctx, "SELECT version FROM "+table+"_migrations ORDER BY version")
		require.NoError(t, err)
		for rows.Next() {
			var v int
			require.NoError(t, rows.Scan(&v))
			versions = append(versions, v)
		}
		require.NoError(t, rows.Err())
		ms, err := inbox.LoadMigrations(mysql.Dialect().Migrations(), table)
		require.NoError(t, err)
		var want []int
		for _, m := range ms {
			want = append(want, m.Version)
		}
		require.Equal(t, want, versions, table)
		var idx []string
		rows, err = db1.QueryContext(ctx, "SELECT DISTINCT index_name FROM information_schema.statistics "+
			"WHERE table_schema = DATABASE() AND table_name = ? ORDER BY index_name", table)
		require.NoError(t, err)
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			idx = append(idx, n)
		}
		require.NoError(t, rows.Err())
		sort.Strings(idx)
		require.Equal(t, []string{"PRIMARY", table + "_expires_at_idx", table + "_status_updated_idx"}, idx, table)
		for _, tbl := range inbox.TableNames(table) {
			_, _ = db1.ExecContext(ctx, "DROP TABLE IF EXISTS "+tbl)
		}
	}
	failures := map[string]int{}
	var failedRounds, retryable int
	for range rounds {
		errs, table := migrate([2]*sql.DB{db1, db2})
		if errs[0] != nil || errs[1] != nil {
			failedRounds++
		}
		for _, err := range errs {
			if err == nil {
				continue
			}
			t.Logf("concurrent Migrate on two nodes: %v", err)
			var me *inbox.MigrationError
			require.ErrorAs(t, err, &me, "a failed Migrate says where: %v", err)
			require.Equal(t, table, me.Table)
			if mysqlCode(err) == 1213 || me.Step == inbox.MigrateRecord {
				// A certification failure (or deadlock) is retryable, and
				// so is recording a version the other node recorded first.
				require.True(t, inbox.IsRetryable(err), "transient: %v", err)
			}
			if inbox.IsRetryable(err) {
				retryable++
			}
			failures[fmt.Sprintf("%s at version %d %s", migrateErrKind(err), me.Version, me.Step)]++
		}
		check(table)
	}
	t.Logf("Migrate on node 1 and node 2 at once: %d rounds, %d with a failed Migrate (%v; %d retryable); schema "+
		"correct after every round, and a second Migrate through either node succeeded",
		rounds, failedRounds, failures, retryable)

	// The safe procedure: every migrator goes through the same node, where
	// GET_LOCK does keep them apart.
	var oneNodeFailures int
	for range rounds {
		errs, table := migrate([2]*sql.DB{db1, c.open(t, 1, syncWait)})
		for _, err := range errs {
			if err != nil {
				oneNodeFailures++
				t.Errorf("concurrent Migrate through one node: %v", err)
			}
		}
		check(table)
	}
	t.Logf("Migrate twice at once through node 1: %d rounds, %d failures", rounds, oneNodeFailures)
}

func migrateErrKind(err error) string {
	if code := mysqlCode(err); code != 0 {
		return fmt.Sprintf("mysql %d", code)
	}
	return err.Error()
}

// testNodeKilled spreads consumers over the three nodes, delivers every
// event at least twice in random order, and SIGKILLs node 3 a third of the
// way through.
func testNodeKilled(t *testing.T, c *cluster) {
	tb := newTables(t, c, 2, 3)
	events := 1000 * scale()
	ds := make([]*dedup.Deduplicator, 3)
	dbs := make([]*sql.DB, 3)
	for i := range 3 {
		db := c.open(t, i+1)
		dbs[i] = db
		s, err := inbox.NewStore(db, mysql.Dialect(), inbox.Config{Table: tb.inbox})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		d, err := dedup.New(s, dedup.Config{Key: dedup.KeyFromMetadata(deduptest.EventIDKey), Operation: "galera_kill"})
		require.NoError(t, err)
		ds[i] = d
	}
	var msgs []*message.Message
	for i := range events {
		ev := eventID(i)
		n := 2
		if i%5 == 0 {
			n = 3
		}
		for range n {
			msgs = append(msgs, deduptest.NewMessage(ev, fmt.Sprintf(`{"event":%q}`, ev)))
		}
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	total := len(msgs)
	queue := make(chan *message.Message, total)
	for _, m := range msgs {
		queue <- m
	}

	var (
		acked         atomic.Int64
		killedAt      atomic.Int64 // unix nanos
		done          = make(chan struct{})
		doneOnce      sync.Once
		mu            sync.Mutex
		nacks         = map[string]int{}
		ackedBy       [4]int // by consumer, before/after the kill are split below
		ackedAfter    [4]int
		switchedTo    = map[int]int{}
		switchErrors  int
		executedAfter int
		lastExec      time.Time     // the last executed delivery through a survivor after the kill
		maxGap        time.Duration // the longest time without one
		evicted       time.Duration // from the kill to wsrep_cluster_size 2 on node 1
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// consumer k starts on node k; when its node stops answering it moves
	// to the next node that does, as a client with a list of cluster
	// addresses would.
	consumer := func(k int) {
		cur := k
		h := func(node int) message.HandlerFunc {
			return ds[node-1].Middleware(func(msg *message.Message) ([]*message.Message, error) {
				msg.Metadata.Set("ran", "1")
				tx, _ := dedup.TxFromContext(msg.Context())
				_, err := tx.ExecContext(msg.Context(), "INSERT INTO "+tb.effects+" (event_id, node) VALUES (?, ?)",
					msg.Metadata.Get(deduptest.EventIDKey), node)
				return nil, err
			})
		}
		handler := h(cur)
		for {
			var msg *message.Message
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case msg = <-queue:
			}
			_, err := handler(msg)
			if err == nil {
				n := acked.Add(1)
				mu.Lock()
				ackedBy[k]++
				if killedAt.Load() != 0 {
					ackedAfter[k]++
					if cur != 3 && msg.Metadata.Get("ran") != "" {
						// An executed delivery: a commit the survivors certified.
						now := time.Now()
						executedAfter++
						if !lastExec.IsZero() && now.Sub(lastExec) > maxGap {
							maxGap = now.Sub(lastExec)
						}
						lastExec = now
					}
				}
				mu.Unlock()
				if int(n) == total {
					doneOnce.Do(func() { close(done) })
				}
				continue
			}
			mu.Lock()
			nacks[nackKind(err)]++
			mu.Unlock()
			again := msg.Copy() // nack: the broker redelivers, maybe to another consumer
			delete(again.Metadata, "ran")
			queue <- again
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			perr := dbs[cur-1].PingContext(pctx)
			pcancel()
			if perr != nil {
				for _, next := range []int{1, 2, 3} {
					if next == cur {
						continue
					}
					pctx, pcancel := context.WithTimeout(ctx, time.Second)
					ok := dbs[next-1].PingContext(pctx) == nil
					pcancel()
					if ok {
						mu.Lock()
						switchedTo[k] = next
						switchErrors++
						mu.Unlock()
						t.Logf("consumer %d: node %d does not answer (%v); moving to node %d", k, cur, perr, next)
						cur, handler = next, h(next)
						break
					}
				}
			}
		}
	}
	var wg sync.WaitGroup
	for k := 1; k <= 3; k++ {
		for range 2 { // two workers per consumer
			wg.Go(func() { consumer(k) })
		}
	}
	// The killer: a third of the way through.
	wg.Go(func() {
		for acked.Load() < int64(total/3) {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		at := time.Now()
		killedAt.Store(at.UnixNano())
		mu.Lock()
		lastExec = at
		mu.Unlock()
		c.nodes[2].kill()
		t.Logf("SIGKILLed node 3 after %d of %d deliveries were acked", acked.Load(), total)
		for ctx.Err() == nil {
			vctx, vcancel := context.WithTimeout(ctx, time.Second)
			vals, err := c.nodes[0].statusMap(vctx, "wsrep_cluster_size")
			vcancel()
			if err == nil && vals["wsrep_cluster_size"] == "2" {
				mu.Lock()
				evicted = time.Since(at)
				mu.Unlock()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	select {
	case <-done:
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	require.EqualValues(t, total, acked.Load(), "the stream drained (nacks %v)", nacks)
	require.NotZero(t, killedAt.Load())

	for _, n := range []int{1, 2} {
		require.NoError(t, c.nodes[n-1].waitSynced(30*time.Second), "node %d", n)
	}
	size := c.nodes[0].status(t, "wsrep_cluster_size")
	counts, _ := effectCounts(t, c, 1, tb.effects)
	dup, lost := 0, 0
	for i := range events {
		switch n := counts[eventID(i)]; {
		case n > 1:
			dup++
		case n == 0:
			lost++
		}
	}
	var records int
	require.NoError(t, c.open(t, 2, syncWait).QueryRow("SELECT COUNT(*) FROM "+tb.inbox+" WHERE status = 'completed'").Scan(&records))
	t.Logf("node kill: %d events, %d deliveries (duplicates included), consumers on nodes 1, 2, 3 (2 workers each); "+
		"acked by consumer 1/2/3: %d/%d/%d, of which after the kill %d/%d/%d; nacks %v; consumers moved: %v; "+
		"node 3 left the view %v after the kill; longest time without an executed delivery on the survivors "+
		"after the kill %v (%d executed after it); wsrep_cluster_size afterwards %s; "+
		"duplicated effects %d, lost %d, completed records %d",
		events, total, ackedBy[1], ackedBy[2], ackedBy[3], ackedAfter[1], ackedAfter[2], ackedAfter[3], nacks,
		switchedTo, evicted.Round(time.Millisecond), maxGap.Round(time.Millisecond), executedAfter, size, dup, lost, records)
	require.Zero(t, dup, "duplicated effects")
	require.Zero(t, lost, "lost events")
	require.Equal(t, events, records)
	require.Equal(t, "2", size)
	require.Positive(t, ackedAfter[1], "consumer on node 1 kept working")
	require.Positive(t, ackedAfter[2], "consumer on node 2 kept working")

	// Node 3 comes back: a plain restart after SIGKILL rejoins by a full
	// state transfer, and the node then holds the one effect per event.
	restart := time.Now()
	require.NoError(t, c.start(c.nodes[2], false))
	require.NoError(t, c.nodes[2].waitSynced(90*time.Second), "node 3 rejoins\n%s", c.nodes[2].errorLog())
	counts3, _ := effectCounts(t, c, 3, tb.effects)
	require.Equal(t, counts, counts3, "node 3 holds the cluster's effects")
	require.Equal(t, "3", c.nodes[0].status(t, "wsrep_cluster_size"))
	t.Logf("node 3 restarted and synced in %v (wsrep_cluster_size 3); its copy has %d events, one effect each",
		time.Since(restart).Round(100*time.Millisecond), len(counts3))
}

// testCausalReads completes an intent through node 1 and reads it at once
// through node 2, with and without wsrep_sync_wait.
func testCausalReads(t *testing.T, c *cluster) {
	tb := newTables(t, c, 2)
	ctx := context.Background()
	newStore := func(n int, params ...string) *inbox.Store {
		s, err := inbox.NewStore(c.open(t, n, params...), mysql.Dialect(), inbox.Config{Table: tb.inbox})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	w, plain, causal := newStore(1), newStore(2), newStore(2, syncWait)
	trials := 300 * scale()
	staleSeen := map[string]int{}
	var stalePlain, staleCausal int
	for i := range trials {
		id := inbox.ID{Operation: "galera_read", Key: eventID(i)}
		res, err := w.Reserve(ctx, inbox.ReserveParams{ID: id, PayloadHash: []byte("h"), Owner: "node1", Lease: time.Minute})
		require.NoError(t, err)
		require.NotNil(t, res.Lease)
		require.NoError(t, res.Lease.Complete(ctx, inbox.Outcome{Result: []byte("done")}))
		// Alternate which read goes first, so that neither is always the
		// one that gives the other's write time to arrive.
		reads := []*inbox.Store{plain, causal}
		if i%2 == 1 {
			reads = []*inbox.Store{causal, plain}
		}
		for _, r := range reads {
			rec, err := r.Get(ctx, r.DB(), id)
			state := "completed"
			switch {
			case errors.Is(err, inbox.ErrNotFound):
				state = "not found"
			case err != nil:
				t.Fatal(err)
			case rec.Status != inbox.StatusCompleted:
				state = string(rec.Status)
			}
			if state == "completed" {
				continue
			}
			if r == causal {
				staleCausal++
			} else {
				stalePlain++
				staleSeen[state]++
			}
		}
	}
	t.Logf("read on node 2 right after Complete on node 1, %d trials: stale with wsrep_sync_wait=0: %d %v; "+
		"with wsrep_sync_wait=1: %d", trials, stalePlain, staleSeen, staleCausal)
	require.Zero(t, staleCausal, "wsrep_sync_wait=1 reads are causal")
}

// testPartitioned cuts node 3 off the cluster (gmcast.isolate), as a
// network partition does: the node leaves the primary component and
// refuses every statement until it rejoins. A delivery through it must
// fail retryable, so that the message is redelivered, not treated as a
// permanent failure.
func testPartitioned(t *testing.T, c *cluster) {
	tb := newTables(t, c, 3)
	nd := c.nodes[2]
	s, err := inbox.NewStore(c.open(t, 3), mysql.Dialect(), inbox.Config{Table: tb.inbox})
	require.NoError(t, err)
	defer s.Close()
	key := dedup.KeyFromMetadata(deduptest.EventIDKey)
	tx, err := dedup.New(s, dedup.Config{Key: key, Operation: "galera_partition"})
	require.NoError(t, err)
	rs, err := dedup.New(s, dedup.Config{Key: key, Operation: "galera_partition_reserve", Mode: dedup.Reserve{}})
	require.NoError(t, err)
	h := deduptest.NoPublish(func(*message.Message) error { return nil })

	_, err = nd.admin.Exec("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'")
	require.NoError(t, err)
	rejoined := false
	defer func() {
		if !rejoined {
			_, _ = nd.admin.Exec("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
		}
	}()
	cut := time.Now()
	require.Eventually(t, func() bool {
		vals, err := nd.statusMap(context.Background(), "wsrep_cluster_status")
		return err == nil && vals["wsrep_cluster_status"] != "Primary"
	}, 30*time.Second, 50*time.Millisecond, "node 3 leaves the primary component")
	t.Logf("node 3 isolated: non-primary after %v", time.Since(cut).Round(time.Millisecond))

	_, txErr := tx.Middleware(h)(deduptest.NewMessage("evt-partition", `{}`))
	_, rsErr := rs.Middleware(h)(deduptest.NewMessage("evt-partition", `{}`))
	t.Logf("delivery through the non-primary node: transactional: %v; reserve: %v", txErr, rsErr)

	_, err = nd.admin.Exec("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
	require.NoError(t, err)
	rejoined = true
	require.NoError(t, nd.waitSynced(60*time.Second), "node 3 rejoins")
	require.Equal(t, "3", c.nodes[0].status(t, "wsrep_cluster_size"))

	for name, err := range map[string]error{"transactional": txErr, "reserve": rsErr} {
		require.Error(t, err, name)
		require.True(t, inbox.IsRetryable(err), "%s: a node outside the primary component is transient (MySQL error %d): %v",
			name, mysqlCode(err), err)
	}
	// Once back, the same delivery goes through.
	_, err = tx.Middleware(h)(deduptest.NewMessage("evt-partition", `{}`))
	require.NoError(t, err)
}
