package dedup

import (
	"sync"
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
	adaptEpoch      = 64
	adaptEpochMax   = time.Second
	adaptEpochFloor = 8
	// A trial of fewer slots (more grouping) is kept when it makes the
	// mean latency adaptGain lower than with the slots it was tried
	// against; a trial of more slots (less grouping) when it is not
	// adaptSlack higher: at a tie, less grouping wins.
	adaptGain  = 0.05
	adaptSlack = 0.02
	// adaptMaxBackoff bounds the epochs between trials after failed ones.
	adaptMaxBackoff = 64
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
}

func newSlotPool(fixed, start int) *slotPool {
	p := &slotPool{}
	if fixed > 0 {
		p.ctl = adaptive{fixed: true, limit: fixed}
	} else {
		p.ctl = adaptive{limit: start, incumbent: start, dir: -1, backoff: 1}
	}
	return p
}

// tryTake takes a free slot if there is one and nobody waits for it.
func (p *slotPool) tryTake() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiting) == 0 && p.used < p.ctl.limit {
		p.used++
		return true
	}
	return false
}

// take waits for a slot and takes it.
func (p *slotPool) take() {
	p.mu.Lock()
	if len(p.waiting) == 0 && p.used < p.ctl.limit {
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
	for len(p.waiting) > 0 && p.used < p.ctl.limit {
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

// done records the latency of one delivery through the pool.
func (p *slotPool) done(lat time.Duration) {
	p.mu.Lock()
	if p.ctl.sample(lat, time.Now()) {
		p.handOver() // the limit may have grown
	}
	p.mu.Unlock()
}

// stats returns the limit (0: unbounded), the trials made and kept.
func (p *slotPool) stats() (limit int, trials, kept uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	limit = p.ctl.limit
	if limit >= unbounded {
		limit = 0
	}
	return limit, p.ctl.trials, p.ctl.kept
}

// adaptive is the slot limit's controller: an incumbent limit, measured
// epoch after epoch, and now and then a trial of another for one epoch.
// Not safe for concurrent use (slotPool.mu guards it).
type adaptive struct {
	fixed bool
	limit int // in force

	// The epoch being measured.
	n     int
	sum   time.Duration
	peak  int // most deliveries in the pool at once
	since time.Time

	incumbent    int
	incumbentLat float64 // its last epoch's mean latency; 0: not measured since the last trial
	trial        int     // the limit on trial; 0: none
	dir          int     // the next trial's direction: -1 fewer slots, +1 more
	wait         int     // epochs before the next trial
	backoff      int     // wait after a trial that lost, doubling
	lastPeak     int     // the peak when the last trial was decided

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
	if a.n < max(adaptEpoch, 2*min(a.peak, a.limit)) && !long || a.n < adaptEpochFloor {
		return false
	}
	before := a.limit
	a.decide(float64(a.sum)/float64(a.n), a.peak)
	a.n, a.sum, a.peak = 0, 0, 0
	return a.limit != before
}

// decide ends an epoch whose mean latency was mean, with at most peak
// deliveries in the pool at once.
func (a *adaptive) decide(mean float64, peak int) {
	if a.trial != 0 {
		up := a.trial > a.incumbent
		kept := mean < a.incumbentLat*(1-adaptGain) || up && mean < a.incumbentLat*(1+adaptSlack)
		if kept {
			a.incumbent, a.incumbentLat = a.trial, mean
			a.kept++
			a.wait, a.backoff = 0, 1 // go on the same way
		} else {
			a.limit = a.incumbent
			a.incumbentLat = 0 // measured again before the next trial
			a.dir = -a.dir
			a.backoff = min(2*a.backoff, adaptMaxBackoff)
			a.wait = a.backoff
		}
		a.trial, a.lastPeak = 0, peak
		return
	}
	a.incumbentLat = mean
	if a.lastPeak > 0 && (peak >= 2*a.lastPeak || 2*peak <= a.lastPeak) {
		// The load moved: try again soon.
		a.wait, a.backoff, a.lastPeak = 0, 1, peak
	}
	if a.wait > 0 {
		a.wait--
		return
	}
	if peak < 2 {
		return // deliveries alone: no group to form
	}
	inUse := min(a.incumbent, peak) // the slots that can be busy at once
	var t int
	switch {
	case a.dir < 0 && inUse > 1:
		t = inUse / 2
	case a.incumbent < peak:
		a.dir = 1
		if t = 2 * a.incumbent; t >= peak {
			t = unbounded
		}
	default:
		// One slot and no more demand than it has: nothing to try.
		a.dir = -1
		return
	}
	if t == a.incumbent {
		return
	}
	a.trial, a.limit = t, t
	a.trials++
}
