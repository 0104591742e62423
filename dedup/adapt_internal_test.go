package dedup

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// simulate runs epochs of a on a system whose mean latency at a limit is
// lat(limit), with ±noise (a share) of random error on every sample and
// peak deliveries in flight, and returns the limit in force in each epoch.
func simulate(a *adaptive, rng *rand.Rand, peak int, noise float64, lat func(limit int) float64, epochs int) []int {
	now := time.Unix(0, 0)
	var history []int
	for range epochs {
		history = append(history, a.limit)
		a.peak = peak
		for {
			l := lat(min(a.limit, peak)) * (1 + noise*(2*rng.Float64()-1))
			now = now.Add(10 * time.Microsecond)
			a.sample(time.Duration(l*float64(time.Microsecond)), now)
			if a.n == 0 {
				break
			}
		}
	}
	return history
}

// simulateNoisy is simulate on a machine whose speed drifts: each
// epoch's latencies are off by a common error, normal with deviation
// epochNoise (a share), besides each sample's own; deliveries arrive as
// a closed loop of peak would send them. It returns the mean latency,
// without the noise, of the deliveries done in [from, to) of simulated
// time: in a closed loop, throughput is peak over it.
func simulateNoisy(a *adaptive, rng *rand.Rand, peak int, epochNoise float64, lat func(limit int) float64, from, to time.Duration) float64 {
	start := time.Unix(0, 0)
	now := start
	var sum float64
	var n int
	for now.Sub(start) < to {
		a.peak = peak
		drift := 1 + epochNoise*rng.NormFloat64()
		for now.Sub(start) < to {
			base := lat(min(a.limit, peak))
			if now.Sub(start) >= from {
				sum += base
				n++
			}
			l := base * drift * (1 + 0.05*(2*rng.Float64()-1))
			now = now.Add(time.Duration(l * float64(time.Microsecond) / float64(peak)))
			a.sample(time.Duration(l*float64(time.Microsecond)), now)
			if a.n == 0 {
				break
			}
		}
	}
	return sum / float64(n)
}

func newAdaptiveForTest() *adaptive {
	return &newSlotPool(0, unbounded, nil).ctl
}

// share returns the share of history within [lo, hi].
func share(history []int, lo, hi int) float64 {
	n := 0
	for _, l := range history {
		if l >= lo && l <= hi {
			n++
		}
	}
	return float64(n) / float64(len(history))
}

// When fewer slots make larger groups that lower the latency down to an
// optimum (four of 32 in flight here, as on PostgreSQL), the limit goes
// there and stays near it.
func TestAdaptiveFindsTheOptimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	a := newAdaptiveForTest()
	// Latency in µs at k slots with 32 in flight: 3000 alone (k=32), best
	// at 4, worse again with one slot.
	lat := map[int]float64{1: 2600, 2: 2200, 4: 1900, 8: 2300, 16: 2700, 32: 3000}
	f := func(k int) float64 {
		for _, c := range []int{1, 2, 4, 8, 16, 32} {
			if k <= c {
				return lat[c]
			}
		}
		return lat[32]
	}
	h := simulate(a, rng, 32, 0.05, f, 400)
	require.Equal(t, 4, a.incumbent, "history %v", h[:40])
	require.Greater(t, share(h[50:], 4, 4), 0.8, "the limit left the optimum too often")
}

// Across a plateau: with 128 deliveries in flight on a pool of 16
// connections, every limit above 16 is the same, and the gain starts
// below it (best at two slots, as the parallel Kafka consumer measured
// on PostgreSQL). A sweep crosses the plateau; with the pool's size known
// it starts below it.
func TestAdaptiveCrossesAPlateau(t *testing.T) {
	f := func(k int) float64 {
		switch {
		case k >= 16:
			return 20000
		case k >= 8:
			return 15000
		case k >= 4:
			return 9000
		case k >= 2:
			return 6000
		}
		return 8000
	}
	for _, capped := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(6, 6))
		a := newAdaptiveForTest()
		if capped {
			a.cap = func() int { return 16 }
		}
		h := simulate(a, rng, 128, 0.05, f, 60)
		require.Equal(t, 2, a.incumbent, "capped=%v: history %v", capped, h)
		require.Greater(t, share(h[20:], 2, 2), 0.7, "capped=%v: history %v", capped, h)
	}
}

// Where every slot fewer loses (8 in flight, an epoch's drift 8%: its
// deliveries take a millisecond or so, so it sees many turns of the
// loop), the trials cost under 6% of latency in the first 5 s and under
// 1% from 10 s to 100 s (4.3% and 0.4% measured).
func TestAdaptiveTrialsCostLittleThroughNoise(t *testing.T) {
	lat := func(k int) float64 { return 1000 + 4000/float64(k) }
	var early, late float64
	const runs = 50
	for seed := range uint64(runs) {
		early += simulateNoisy(newAdaptiveForTest(), rand.New(rand.NewPCG(seed, 7)), 8, 0.08, lat, 0, 5*time.Second) / lat(8)
		late += simulateNoisy(newAdaptiveForTest(), rand.New(rand.NewPCG(seed, 7)), 8, 0.08, lat, 10*time.Second, 100*time.Second) / lat(8)
	}
	require.Less(t, early/runs, 1.06, "mean latency over unbounded's, 0-5 s")
	require.Less(t, late/runs, 1.01, "mean latency over unbounded's, 10-100 s")
}

// When grouping only makes deliveries wait (the latency falls with every
// slot more), the limit stays unbounded, and trials come less and less
// often.
func TestAdaptiveStaysOffWhereGroupsLose(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	a := newAdaptiveForTest()
	f := func(k int) float64 { return 1000 + 4000/float64(k) } // 8 in flight
	h := simulate(a, rng, 8, 0.05, f, 600)
	require.Equal(t, unbounded, a.incumbent)
	require.Greater(t, share(h, unbounded, unbounded), 0.9)
	require.Greater(t, share(h[300:], unbounded, unbounded), 0.97, "trials kept coming: backoff %d", a.backoff)
	require.LessOrEqual(t, a.trials, uint64(20))
}

// At a tie grouping stays off: a sweep of fewer slots must gain. (Its
// epochs cost nothing here, every limit being as fast; they are under one
// in six.)
func TestAdaptivePrefersLessGroupingAtATie(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	a := newAdaptiveForTest()
	h := simulate(a, rng, 16, 0.01, func(int) float64 { return 1000 }, 300)
	require.Greater(t, share(h[100:], unbounded, unbounded), 0.83)
	require.Equal(t, unbounded, a.incumbent)
}

// A fixed limit never moves, and one delivery at a time has no group to
// form: no trial.
func TestAdaptiveFixedAndAlone(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	fixed := &newSlotPool(3, unbounded, nil).ctl
	h := simulate(fixed, rng, 32, 0.1, func(k int) float64 { return float64(1000 * k) }, 50)
	require.Equal(t, 1.0, share(h, 3, 3))
	alone := newAdaptiveForTest()
	simulate(alone, rng, 1, 0.1, func(k int) float64 { return 100 }, 50)
	require.Zero(t, alone.trials)
}

// When the load moves (the deliveries in flight double), trials resume
// at once rather than after the backoff.
func TestAdaptiveFollowsTheLoad(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	a := newAdaptiveForTest()
	simulate(a, rng, 8, 0.02, func(k int) float64 { return 1000 + 4000/float64(k) }, 300)
	require.Equal(t, unbounded, a.incumbent)
	// At 64 in flight, groups of 8 pay.
	f := func(k int) float64 {
		if k <= 8 {
			return 2000 + 500*float64(8/k)
		}
		return 2000 + 60*float64(k)
	}
	h := simulate(a, rng, 64, 0.02, f, 60)
	require.LessOrEqual(t, a.incumbent, 8, "history %v", h)
}

// The pool hands slots to the leaders waiting, first first, and a limit
// that grows wakes them.
func TestSlotPoolHandsOver(t *testing.T) {
	p := newSlotPool(1, unbounded, nil)
	require.True(t, p.tryTake())
	require.False(t, p.tryTake())
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.take()
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			p.put()
		}()
		require.Eventually(t, func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.waiting) == i+1
		}, time.Second, time.Millisecond)
	}
	p.put()
	wg.Wait()
	require.Equal(t, []int{0, 1, 2}, order)
	require.True(t, p.tryTake(), "a slot is free again")

	g := newSlotPool(0, unbounded, nil)
	g.ctl.limit = 1
	require.True(t, g.tryTake())
	done := make(chan struct{})
	go func() { g.take(); close(done) }()
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.waiting) == 1 }, time.Second, time.Millisecond)
	g.mu.Lock()
	g.ctl.limit = 2
	g.handOver()
	g.mu.Unlock()
	<-done
}

// An epoch measures a limit by the deliveries that entered under it once
// every delivery of an earlier limit was done: neither those still inside
// when the limit changed, nor those that entered beside them.
func TestSlotPoolMeasuresOnlySettledDeliveries(t *testing.T) {
	p := newSlotPool(0, unbounded, nil)
	before := p.enter() // inside when the limit changes
	p.gen++             // as a decision that changed the limit does
	p.old = p.inside
	beside := p.enter() // enters while before is still inside
	require.True(t, beside.shared)
	p.done(time.Hour, before)
	p.done(time.Hour, beside)
	require.Zero(t, p.ctl.n, "a latency of an unsettled delivery was sampled")
	require.Zero(t, p.old)
	require.Zero(t, p.inside)
	after := p.enter()
	require.False(t, after.shared)
	p.done(time.Millisecond, after)
	require.Equal(t, 1, p.ctl.n)
	require.Equal(t, time.Millisecond, p.ctl.sum)
}
