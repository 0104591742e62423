package inbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// clockSync keeps the offset between the store's clock and the database's.
type clockSync struct {
	every    time.Duration // 0: off
	offset   atomic.Int64  // database minus local, in nanoseconds
	measured atomic.Bool
	next     atomic.Int64 // local UnixNano of the next measurement
	running  atomic.Bool  // a background measurement is in flight
	tried    atomic.Int64 // UnixNano of the last syncBeforeLease

	// The background measurement runs under ctx; Store.Close cancels it
	// and waits for it through wg. closed keeps a Close'd store from
	// starting another.
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
}

func (c *clockSync) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.stop()
	c.wg.Wait()
}

// start runs f in the background unless the store was closed, and
// reports whether it did. Close cancels f's context and waits for it.
func (c *clockSync) start(f func(ctx context.Context)) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.running.Store(false)
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f(c.ctx)
	}()
	return true
}

// clockSyncTimeout bounds one measurement.
const clockSyncTimeout = 5 * time.Second

// maxClockRTT is the slowest round trip whose measurement replaces an
// earlier one.
const maxClockRTT = 500 * time.Millisecond

// precision is the resolution of the store's times: what every database
// keeps of a timestamp (PostgreSQL's timestamptz, MySQL's DATETIME(6), the
// SQLite schema's integer microseconds).
const precision = time.Microsecond

// dbTime cuts t to the microsecond. The store does so with every time it
// computes or binds, because the drivers differ on what they do with the
// nanoseconds (pq and MySQL's driver send them and the server rounds, pgx
// and the SQLite dialect drop them): cut here, a time is stored exactly as
// the store holds it, the record a write returns equals the one a read
// finds, and a Go predicate compares what the SQL compares.
func dbTime(t time.Time) time.Time { return t.Truncate(precision) }

// now is Config.Now corrected by the last measured offset. When a
// measurement is due it starts one in the background and goes on with the
// offset it has: now is called with the caller's transaction open, and a
// query of its own would need a second connection the pool may not have.
func (s *Store) now() time.Time {
	t := s.clock()
	c := &s.sync
	if c.every <= 0 {
		return dbTime(t)
	}
	if t.UnixNano() >= c.next.Load() && c.running.CompareAndSwap(false, true) {
		c.start(func(ctx context.Context) {
			defer c.running.Store(false)
			ctx, cancel := context.WithTimeout(ctx, clockSyncTimeout)
			defer cancel()
			_ = s.SyncClock(ctx) // on failure the previous offset stays
		})
	}
	return dbTime(t.Add(time.Duration(c.offset.Load())))
}

// SyncClock measures the offset between Config.Now and the database
// server's clock now, and corrects [Store.Now] by it from then on. The store
// does this by itself in the background every Config.ClockSync, starting
// at its first use, and before its first lease ([Store.Reserve],
// [Store.TakeOver]); call SyncClock at start-up to have it done before
// taking work. It does nothing (and returns nil) when clock sync is off or
// the dialect's clients share the database's clock.
//
// The offset is the server's time minus the local time halfway through the
// query's round trip, so it is off by at most half of that round trip; a
// measurement whose round trip took over half a second is not used.
func (s *Store) SyncClock(ctx context.Context) error {
	c := &s.sync
	if c.every <= 0 {
		return nil
	}
	retrySoon := func() { c.next.Store(s.clock().Add(min(c.every, time.Second)).UnixNano()) }
	// A connection first, so that waiting for one is not counted as the
	// query's round trip.
	conn, err := s.db.Conn(ctx)
	if err != nil {
		retrySoon()
		return fmt.Errorf("inbox: read the database's clock: %w", s.Classify(err))
	}
	defer conn.Close()
	before := s.clock()
	var micros int64
	if err := conn.QueryRowContext(ctx, s.q.clock.SQL).Scan(&micros); err != nil {
		retrySoon()
		return fmt.Errorf("inbox: read the database's clock: %w", s.Classify(err))
	}
	after := s.clock()
	if after.Sub(before) > maxClockRTT {
		// A slow answer bounds the offset only to half its round trip:
		// keep the earlier measurement, if any, and try again soon.
		retrySoon()
		return nil
	}
	local := before.Add(after.Sub(before) / 2)
	c.offset.Store(int64(time.UnixMicro(micros).Sub(local)))
	c.measured.Store(true)
	c.next.Store(after.Add(c.every).UnixNano())
	return nil
}

// ClockOffset returns the last measured offset of the database's clock
// from Config.Now (positive: the database is ahead), and whether one was
// measured yet.
func (s *Store) ClockOffset() (time.Duration, bool) {
	return time.Duration(s.sync.offset.Load()), s.sync.measured.Load()
}

// clockRetry spaces out the synchronous measurement before a lease while
// none has succeeded: at most one a second, so a database that does not
// answer the clock query is not asked on every reservation.
const clockRetry = time.Second

// syncBeforeLease measures the clock before the store's first lease, so
// that not even that one is judged by an unsynchronized clock. A failure
// leaves the local clock in use; the lease's own statement then reports a
// database that is down.
func (s *Store) syncBeforeLease(ctx context.Context) {
	c := &s.sync
	if c.every <= 0 || c.measured.Load() {
		return
	}
	now := time.Now().UnixNano()
	last := c.tried.Load()
	if now-last < int64(clockRetry) || !c.tried.CompareAndSwap(last, now) {
		return
	}
	_ = s.SyncClock(ctx)
}
