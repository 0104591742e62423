package inboxtest

import (
	"sync/atomic"
	"time"
)

// Clock is the wall clock plus an offset that tests move forward, so that
// leases expire without sleeping. Pass its Now as inbox.Config.Now; stores
// sharing one Clock agree on time. The zero value is the wall clock, and a
// Clock is safe for concurrent use.
type Clock struct{ offset atomic.Int64 }

// Now returns the wall clock's time plus every Advance so far.
func (c *Clock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }
