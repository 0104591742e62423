package inbox

import (
	"context"
	"fmt"
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
}

// clockSyncTimeout bounds one measurement.
const clockSyncTimeout = 5 * time.Second

// maxClockRTT is the slowest round trip whose measurement replaces an
// earlier one.
const maxClockRTT = 500 * time.Millisecond

// now is Config.Now corrected by the last measured offset. When a
// measurement is due it starts one in the background and goes on with the
// offset it has: now is called with the caller's transaction open, and a
// query of its own would need a second connection the pool may not have.
func (s *Store) now() time.Time {
	t := s.clock()
	c := &s.sync
	if c.every <= 0 {
		return t
	}
	if t.UnixNano() >= c.next.Load() && c.running.CompareAndSwap(false, true) {
		go func() {
			defer c.running.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), clockSyncTimeout)
			defer cancel()
			_ = s.SyncClock(ctx) // on failure the previous offset stays
		}()
	}
	return t.Add(time.Duration(c.offset.Load()))
}

// SyncClock measures the offset between Config.Now and the database
// server's clock now, and corrects [Store.Now] by it from then on. The store
// does this by itself in the background every Config.ClockSync, starting
// at its first use; call SyncClock at start-up, before taking work, so
// that not even the first lease is judged by an unsynchronized clock. It
// does nothing (and returns nil) when clock sync is off or the dialect has
// no Queries.Clock.
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
	if err := conn.QueryRowContext(ctx, s.q.Clock).Scan(&micros); err != nil {
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
