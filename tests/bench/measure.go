package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// result is one BENCH line.
type result struct {
	scenario, dialect string
	workers, msgs     int
	perSec            float64
	p50, p99          time.Duration
	allocs            float64 // heap allocations per message
}

func (r result) String() string {
	return fmt.Sprintf("BENCH scenario=%s dialect=%s workers=%d msgs=%d msgs_per_s=%.1f p50_us=%.1f p99_us=%.1f allocs_per_msg=%.1f",
		r.scenario, r.dialect, r.workers, r.msgs, r.perSec, micros(r.p50), micros(r.p99), r.allocs)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func (b *bench) report(r result) {
	b.results = append(b.results, r)
	fmt.Fprintln(b.out, r)
}

// reportRounds reports the median of one cell's rounds and keeps the
// rounds for the paired ratios.
func (b *bench) reportRounds(rs []result) {
	if len(rs) > 1 {
		if b.rounds == nil {
			b.rounds = map[string][]result{}
		}
		b.rounds[roundKey(rs[0].scenario, rs[0].dialect, rs[0].workers)] = rs
	}
	b.report(median(rs))
}

func roundKey(scenario, dialect string, workers int) string {
	return fmt.Sprintf("%s/%s/%d", scenario, dialect, workers)
}

// find returns the result of scenario on dialect with workers, if measured.
func (b *bench) find(scenario, dialect string, workers int) (result, bool) {
	for _, r := range b.results {
		if r.scenario == scenario && r.dialect == dialect && r.workers == workers {
			return r, true
		}
	}
	return result{}, false
}

// eventPayload is a small order event; order_id and amount vary so that
// every fingerprint is computed over a different payload.
const eventPayload = `{"order_id":"o-%d","amount":%d,"currency":"EUR","sent_at":"2026-11-30T12:00:00Z"}`

// newMessages builds n events, each with a fresh random event_id (like a
// UUID event ID, it lands anywhere in the key index). With marks, message i
// carries &marks[i] in its context for a handler to stamp (see markClaimed).
func newMessages(n int, marks []time.Time) []*message.Message {
	return newKeyedMessages(n, marks, keysRandom)
}

// newKeyedMessages is newMessages with event IDs made as keys says.
func newKeyedMessages(n int, marks []time.Time, keys keyOrder) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, eventPayload, i, 100+i%900))
		msg.Metadata.Set("event_id", keys.eventID())
		if marks != nil {
			msg.SetContext(context.WithValue(context.Background(), markKey{}, &marks[i]))
		}
		msgs[i] = msg
	}
	return msgs
}

type markKey struct{}

// markClaimed records when the handler started, which for the dedup
// middleware is when the claim was made: message i's latency then counts
// up to the claim instead of to the end of the delivery.
func markClaimed(msg *message.Message) {
	if p, ok := msg.Context().Value(markKey{}).(*time.Time); ok {
		*p = time.Now()
	}
}

func eventID(msg *message.Message) string { return msg.Metadata.Get("event_id") }

// deliverAll runs h over msgs with workers goroutines, each taking every
// workers-th message, and returns the first error.
func deliverAll(ctx context.Context, workers int, msgs []*message.Message, h message.HandlerFunc) error {
	_, err := measure(ctx, workers, msgs, h, nil)
	return err
}

// measure runs h over msgs with workers goroutines (worker w delivers
// messages w, w+workers, …, one after another) and measures throughput
// over the wall time from the start signal to the last worker's end,
// per-message latency (to the end of h, or to the mark h stamped), and heap
// allocations per message from runtime.MemStats.Mallocs, which counts every
// goroutine's: the database drivers' included, and with several workers the
// connection pool's.
func measure(ctx context.Context, workers int, msgs []*message.Message, h message.HandlerFunc, marks []time.Time) (
	result, error,
) {
	lat := make([]time.Duration, len(msgs))
	errs := make([]error, workers)
	var (
		wg     sync.WaitGroup
		failed atomic.Bool
		start  = make(chan struct{})
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := w; i < len(msgs); i += workers {
				if failed.Load() || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				_, err := h(msgs[i])
				if err != nil {
					errs[w] = fmt.Errorf("message %d (event %s): %w", i, eventID(msgs[i]), err)
					failed.Store(true)
					return
				}
				if marks != nil {
					lat[i] = marks[i].Sub(t0)
				} else {
					lat[i] = time.Since(t0)
				}
			}
		}()
	}
	// Start every measurement with the heap collected, so that none pays
	// for the garbage of the one before.
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	runtime.ReadMemStats(&m1)
	for _, err := range errs {
		if err != nil {
			return result{}, err
		}
	}
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	n := len(msgs)
	r := result{workers: workers, msgs: n, perSec: float64(n) / elapsed.Seconds(),
		allocs: float64(m1.Mallocs-m0.Mallocs) / float64(n)}
	r.p50, r.p99 = percentiles(lat)
	return r, nil
}

// median returns rs[0] with each measured value replaced by its median over
// rs (the mean of the middle two for an even count).
func median(rs []result) result {
	mid := func(v func(result) float64) float64 {
		vs := make([]float64, len(rs))
		for i, r := range rs {
			vs[i] = v(r)
		}
		slices.Sort(vs)
		n := len(vs)
		if n%2 == 1 {
			return vs[n/2]
		}
		return (vs[n/2-1] + vs[n/2]) / 2
	}
	m := rs[0]
	m.perSec = mid(func(r result) float64 { return r.perSec })
	m.p50 = time.Duration(mid(func(r result) float64 { return float64(r.p50) }))
	m.p99 = time.Duration(mid(func(r result) float64 { return float64(r.p99) }))
	m.allocs = mid(func(r result) float64 { return r.allocs })
	return m
}

// percentiles returns the nearest-rank p50 and p99 of lat.
func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	rank := func(p int) time.Duration { return s[max((len(s)*p+99)/100-1, 0)] }
	return rank(50), rank(99)
}

// warmFor runs h with workers goroutines, each delivering fresh messages
// one after another, until d has passed, and returns how many it
// delivered. It keeps the load steady for that long, as the measured run
// does, so that what adapts to the load (connection pools, the adaptive
// limits of groups and batches) is measured settled, not starting.
func warmFor(ctx context.Context, workers int, d time.Duration, h message.HandlerFunc) (int, error) {
	if d <= 0 {
		return 0, nil
	}
	deadline := time.Now().Add(d)
	var (
		wg     sync.WaitGroup
		n      atomic.Int64
		failed atomic.Bool
		errs   = make([]error, workers)
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline) && !failed.Load() && ctx.Err() == nil; i++ {
				msg := newMessages(1, nil)[0]
				if _, err := h(msg); err != nil {
					errs[w] = fmt.Errorf("warm-up message (event %s): %w", eventID(msg), err)
					failed.Store(true)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return int(n.Load()), ctx.Err()
}
