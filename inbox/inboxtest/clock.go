package inboxtest

import (
	"sync/atomic"
	"time"
)

// clock is the wall clock plus an offset that tests move forward, so that
// leases expire without sleeping. Stores sharing one clock agree on time.
type clock struct{ offset atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }
