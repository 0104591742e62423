package dedup

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcome is what the middleware did with one delivery.
type Outcome string

const (
	// OutcomeExecuted: the key was new; the handler ran and its transaction
	// committed.
	OutcomeExecuted Outcome = "executed"
	// OutcomeDuplicate: the key was done already with the same payload; the
	// handler did not run and the stored output was handed back.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeConflict: the key was done already with another payload; the
	// handler did not run and the message was refused.
	OutcomeConflict Outcome = "conflict"
	// OutcomeInFlight: another delivery held the key; the message was nacked.
	OutcomeInFlight Outcome = "in_flight"
	// OutcomeInvalid: no usable key; the handler did not run.
	OutcomeInvalid Outcome = "invalid"
	// OutcomeRetry: the handler or the database failed transiently;
	// everything was rolled back (transactional mode) or the reservation
	// released (reserve mode), and the message nacked for a clean retry.
	OutcomeRetry Outcome = "retry"
	// OutcomeFailed: the handler failed permanently (Permanent); the intent
	// is recorded as failed and will not run again.
	OutcomeFailed Outcome = "failed"
	// OutcomePending: in reserve mode, the outcome of the external effect is
	// uncertain; the record waits for reconciliation.
	OutcomePending Outcome = "pending"
)

// Stats counts outcomes since the middleware was created.
type Stats struct {
	Executed, Duplicates, Conflicts, InFlight, Invalid, Retries, Failed, Pending uint64
	// Takeovers counts reserve-mode claims of an expired or released lease.
	Takeovers uint64
	// OutputsDropped counts executed deliveries (counted in Executed too)
	// whose output was too large for the store to keep
	// (inbox.ErrResultTooLarge): they completed without stored output, and
	// their duplicates are acked without replaying it. It is counted when
	// the store refuses the output, before the commit: a delivery whose
	// commit then fails is counted again when its retry drops the output.
	OutputsDropped uint64
}

type counters struct {
	executed, duplicate, conflict, inFlight, invalid, retry, failed, pending, takeover atomic.Uint64
	outputDropped                                                                      atomic.Uint64
}

func (c *counters) add(o Outcome) {
	switch o {
	case OutcomeExecuted:
		c.executed.Add(1)
	case OutcomeDuplicate:
		c.duplicate.Add(1)
	case OutcomeConflict:
		c.conflict.Add(1)
	case OutcomeInFlight:
		c.inFlight.Add(1)
	case OutcomeInvalid:
		c.invalid.Add(1)
	case OutcomeRetry:
		c.retry.Add(1)
	case OutcomeFailed:
		c.failed.Add(1)
	case OutcomePending:
		c.pending.Add(1)
	}
}

func (c *counters) snapshot() Stats {
	return Stats{
		Executed: c.executed.Load(), Duplicates: c.duplicate.Load(), Conflicts: c.conflict.Load(),
		InFlight: c.inFlight.Load(), Invalid: c.invalid.Load(), Retries: c.retry.Load(),
		Failed: c.failed.Load(), Pending: c.pending.Load(), Takeovers: c.takeover.Load(),
		OutputsDropped: c.outputDropped.Load(),
	}
}

// metrics are the Prometheus collectors; nil when no Registerer was given.
type metrics struct {
	messages  *prometheus.CounterVec
	takeovers *prometheus.CounterVec
	claim     *prometheus.HistogramVec
	dropped   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "inboxmill",
			Subsystem: "dedup",
			Name:      "messages_total",
			Help:      "Deliveries seen by the dedup middleware, by operation and outcome.",
		}, []string{"operation", "outcome"}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "inboxmill",
			Subsystem: "dedup",
			Name:      "takeovers_total",
			Help:      "Reserve-mode claims of an intent whose lease had expired or was released, by operation.",
		}, []string{"operation"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "inboxmill",
			Subsystem: "dedup",
			Name:      "outputs_dropped_total",
			Help:      "Executed deliveries whose output was too large to store, so that their duplicates replay none, by operation.",
		}, []string{"operation"}),
		claim: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "inboxmill",
			Subsystem: "dedup",
			Name:      "claim_duration_seconds",
			Help:      "Time to claim a key in the inbox (insert, or read the existing record).",
			Buckets:   []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"operation"}),
	}
	var err error
	m.messages, err = register(reg, m.messages)
	if err != nil {
		return nil, err
	}
	m.takeovers, err = register(reg, m.takeovers)
	if err != nil {
		return nil, err
	}
	m.claim, err = register(reg, m.claim)
	if err != nil {
		return nil, err
	}
	m.dropped, err = register(reg, m.dropped)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector already registered under
// the same description, so that several middlewares can share a registry.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}

func (m *metrics) observe(op string, o Outcome) {
	if m != nil {
		m.messages.WithLabelValues(op, string(o)).Inc()
	}
}

func (m *metrics) observeTakeover(op string) {
	if m != nil {
		m.takeovers.WithLabelValues(op).Inc()
	}
}

func (m *metrics) observeClaim(op string, d time.Duration) {
	if m != nil {
		m.claim.WithLabelValues(op).Observe(d.Seconds())
	}
}

func (m *metrics) observeOutputDropped(op string) {
	if m != nil {
		m.dropped.WithLabelValues(op).Inc()
	}
}
