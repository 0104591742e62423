package dedup

import (
	"database/sql"
	"sync"
	"sync/atomic"
	"time"
)

// unbounded is a slot limit no number of deliveries reaches: every one
// gets a slot, so none waits to join a group or a batch.
const unbounded = 1 << 30

// Settings of the adaptive slot limit.
const (
	// adaptEpoch is the fewest latencies an epoch averages; an epoch also
	// takes twice as many as were in flight at once, and at most
	// adaptEpochMax of time (with at least adaptEpochFloor latencies).
	adaptEpoch      = 128
	adaptEpochMax   = time.Second
	adaptEpochMin   = 250 * time.Millisecond
	adaptEpochFloor = 8
	// A trial of fewer slots (more grouping) is kept when it makes the
	// mean latency adaptGain lower than with the slots it was tried
	// against; a trial of more slots (less grouping) when it is not
	// adaptSlack higher: at a tie, less grouping wins.
	adaptGain  = 0.10
	adaptSlack = 0.02
	// adaptMaxBackoff bounds the epochs between trials after failed ones.
	adaptMaxBackoff = 64
	// adaptSettle is the fewest epochs between two sweeps: the limit
	// they chose runs that long before the next explores again.
	adaptSettle = 4
)

// slotPool is how many groups (or batch statements) run at once. Each
// holds a slot while it runs; a delivery that finds no slot free joins
// the group that forms while it waits, so fewer slots make fewer, larger
// groups and more slots run more at once.
//
// Unless fixed, the limit adapts: it starts unbounded (every delivery
// runs alone, as without groups) and now and then tries fewer slots, or
// more, for one epoch, keeping the trial when the deliveries' mean
// latency — from entering the pool to their result — improved. Under the
// closed loop a consumer is (the next message comes when one is done)
// the lowest mean latency is the highest throughput; and where a group
// would only make a delivery wait, the trial loses and grouping stays
// off. Trials that lose come less and less often.
type slotPool struct {
	mu      sync.Mutex
	ctl     adaptive
	used    int
	waiting []chan struct{} // leaders waiting for a slot, first first
	// follow, when set, is the pool whose limit this one keeps: it
	// measures nothing itself (see newFollower). followers are the pools
	// that follow this one; lim is the limit in force, for them to read.
	follow    *slotPool
	followers []*slotPool
	lim       atomic.Int64
	// gen counts the limit's changes. A delivery that entered under
	// another limit than the one in force when it is done says nothing of
	// this one, and neither does one that shared the pool with such
	// deliveries (it may have waited behind those the last limit let in):
	// an epoch measures only deliveries that entered once every delivery
	// of earlier generations (old, of the inside) was done.
	gen         uint64
	inside, old int
}

// newSlotPool returns a pool of fixed slots, or, with fixed 0, an
// adaptive one starting at start; capOf, when set, returns the most slots
// that can be busy at once however many the limit allows (the size of
// the connection pool the groups or statements run on; 0: no bound).
func newSlotPool(fixed, start int, capOf func() int) *slotPool {
	p := &slotPool{}
	if fixed > 0 {
		p.ctl = adaptive{fixed: true, limit: fixed}
	} else {
		p.ctl = adaptive{limit: start, incumbent: start, dir: -1, backoff: 1, cap: capOf}
	}
	p.lim.Store(int64(p.ctl.limit))
	return p
}

// newFollower returns a pool whose limit is leader's. Two stages that
// share one database (reserve mode's reservations and completions) follow
// one controller, which measures what both serve — a delivery from its
// reservation to its completion — rather than each stage its own share of
// it: a stage's own latency need not improve when fewer statements free
// the database for the other stage and the handlers.
func newFollower(leader *slotPool) *slotPool {
	p := &slotPool{follow: leader}
	leader.mu.Lock()
	leader.followers = append(leader.followers, p)
	leader.mu.Unlock()
	return p
}

// limit returns the number of slots in force; p.mu is held.
func (p *slotPool) limit() int {
	if p.follow != nil {
		return int(p.follow.lim.Load())
	}
	return p.ctl.limit
}

// tryTake takes a free slot if there is one and nobody waits for it.
func (p *slotPool) tryTake() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiting) == 0 && p.used < p.limit() {
		p.used++
		return true
	}
	return false
}

// take waits for a slot and takes it.
func (p *slotPool) take() {
	p.mu.Lock()
	if len(p.waiting) == 0 && p.used < p.limit() {
		p.used++
		p.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	p.waiting = append(p.waiting, ch)
	p.mu.Unlock()
	<-ch // the slot is handed over with it
}

// put frees a slot, handing it to the first leader waiting.
func (p *slotPool) put() {
	p.mu.Lock()
	p.used--
	p.handOver()
	p.mu.Unlock()
}

// handOver gives free slots to waiting leaders; p.mu is held.
func (p *slotPool) handOver() {
	for len(p.waiting) > 0 && p.used < p.limit() {
		ch := p.waiting[0]
		p.waiting[0] = nil
		p.waiting = p.waiting[1:]
		p.used++
		close(ch)
	}
}

// demand records how many deliveries use or wait for the pool now.
func (p *slotPool) demand(n int) {
	p.mu.Lock()
	if n > p.ctl.peak {
		p.ctl.peak = n
	}
	p.mu.Unlock()
}

// ticket is what a delivery holds from entering the pool to done.
type ticket struct {
	gen uint64 // the generation it entered in
	// shared: it entered while deliveries of an earlier generation were
	// inside, so its latency says nothing of this limit either.
	shared bool
}

// enter counts a delivery entering the pool; done must follow.
func (p *slotPool) enter() ticket {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inside++
	if p.inside > p.ctl.peak {
		p.ctl.peak = p.inside
	}
	return ticket{gen: p.gen, shared: p.old > 0}
}

// done records the latency of one delivery through the pool.
func (p *slotPool) done(lat time.Duration, t ticket) {
	p.mu.Lock()
	p.inside--
	changed := false
	switch {
	case t.gen != p.gen:
		p.old-- // it was inside when the limit changed
	case t.shared:
	case p.ctl.sample(lat, time.Now()):
		changed = true
		p.gen++
		p.old = p.inside // every delivery inside is of an earlier limit now
		p.lim.Store(int64(p.ctl.limit))
		p.handOver() // the limit may have grown
	}
	followers := p.followers
	p.mu.Unlock()
	if changed {
		for _, f := range followers {
			f.mu.Lock()
			f.handOver()
			f.mu.Unlock()
		}
	}
}

// stats returns the limit (0: unbounded), the trials made and kept.
func (p *slotPool) stats() (limit int, trials, kept uint64) {
	if p.follow != nil {
		return p.follow.stats()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	limit = p.ctl.limit
	if limit >= unbounded {
		limit = 0
	}
	return limit, p.ctl.trials, p.ctl.kept
}

// adaptive is the slot limit's controller: an incumbent limit, measured
// epoch after epoch, and now and then a sweep of others, one epoch each.
// A sweep goes one way — halving the slots, or doubling them — for as
// long as each step is within adaptGain of the best seen so far (so that
// it crosses a plateau, such as every limit above the connection pool's
// size, where slots make no difference, and the noise on it), and then
// keeps the best step if
// it beat the incumbent: by adaptGain for fewer slots, or by not losing
// adaptSlack for more. Sweeps alternate their direction; one that keeps
// nothing backs off. Not safe for concurrent use (slotPool.mu guards it).
type adaptive struct {
	fixed bool
	limit int // in force
	// cap, when set, returns the most slots that can be busy at once
	// whatever the limit (the connection pool's size; 0 none).
	cap func() int

	// The epoch being measured.
	n     int
	sum   time.Duration
	peak  int // most deliveries in the pool at once
	since time.Time

	incumbent    int
	incumbentLat float64 // its last epoch's mean latency
	sweeping     bool
	best         int     // the sweep's best step so far, and its latency
	bestLat      float64 //
	dir          int     // the next sweep's direction: -1 fewer slots, +1 more
	wait         int     // epochs before the next sweep
	backoff      int     // wait after a sweep that kept nothing, doubling
	lastPeak     int     // the peak when the last sweep ended

	trials, kept uint64
}

// sample adds a latency to the epoch and, when it ends one, decides. It
// reports whether the limit changed.
func (a *adaptive) sample(lat time.Duration, now time.Time) bool {
	if a.fixed {
		return false
	}
	if a.n == 0 {
		a.since = now
	}
	a.n++
	a.sum += lat
	long := now.Sub(a.since) >= adaptEpochMax
	short := now.Sub(a.since) < adaptEpochMin
	if (a.n < max(adaptEpoch, 2*min(a.peak, a.limit)) || short) && !long || a.n < adaptEpochFloor {
		return false
	}
	before := a.limit
	a.decide(float64(a.sum)/float64(a.n), a.peak)
	a.n, a.sum, a.peak = 0, 0, 0
	return a.limit != before
}

// ceiling is the most slots that can be busy at once: the peak of
// deliveries, and the cap.
func (a *adaptive) ceiling(peak int) int {
	c := peak
	if a.cap != nil {
		if n := a.cap(); n > 0 {
			c = min(c, n)
		}
	}
	return c
}

// step returns the limit after from in direction dir, or 0 when there is
// none: half as many slots as can be busy, or twice as many (unbounded
// once that reaches the ceiling).
func (a *adaptive) step(from, dir, peak int) int {
	c := a.ceiling(peak)
	if dir < 0 {
		if inUse := min(from, c); inUse > 1 {
			return inUse / 2
		}
		return 0
	}
	if from >= c {
		return 0
	}
	if t := 2 * from; t < c {
		return t
	}
	return unbounded
}

// decide ends an epoch whose mean latency was mean, with at most peak
// deliveries in the pool at once.
func (a *adaptive) decide(mean float64, peak int) {
	if a.sweeping {
		if mean < a.bestLat {
			a.best, a.bestLat = a.limit, mean
		}
		if mean <= a.bestLat*(1+adaptGain) {
			if next := a.step(a.limit, a.dir, peak); next != 0 {
				a.limit = next
				a.trials++
				return
			}
		}
		a.sweeping = false
		down := a.best < a.incumbent
		keep := a.best != a.incumbent && (down && a.bestLat < a.incumbentLat*(1-adaptGain) ||
			!down && a.bestLat < a.incumbentLat*(1+adaptSlack))
		if keep {
			a.incumbent, a.incumbentLat = a.best, a.bestLat
			a.kept++
			a.backoff, a.wait = 1, adaptSettle
		} else {
			a.backoff = min(max(2*a.backoff, adaptSettle), adaptMaxBackoff)
			a.wait = a.backoff
		}
		a.limit = a.incumbent
		a.dir = -a.dir
		a.lastPeak = peak
		return
	}
	a.incumbentLat = mean
	if a.lastPeak > 0 && (peak >= 2*a.lastPeak || 2*peak <= a.lastPeak) {
		// The load moved: sweep again soon.
		a.wait, a.backoff, a.lastPeak = 0, 1, peak
	}
	if a.wait > 0 {
		a.wait--
		return
	}
	if peak < 2 {
		return // deliveries alone: no group to form
	}
	next := a.step(a.incumbent, a.dir, peak)
	if next == 0 {
		a.dir = -a.dir
		if next = a.step(a.incumbent, a.dir, peak); next == 0 {
			return
		}
	}
	a.sweeping, a.best, a.bestLat = true, a.incumbent, mean
	a.limit = next
	a.trials++
}

// poolSize returns the store's connection pool's size (0: unbounded): each
// group, and each batch statement, holds a connection, so no more of them
// than that run at once whatever the limit.
func poolSize(store interface{ DB() *sql.DB }) func() int {
	return func() int { return store.DB().Stats().MaxOpenConnections }
}
