package reconcile

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmill/inboxmill/inbox"
)

type reconcilerMetrics struct {
	pending, oldest, unresolved prometheus.Gauge
	resolvedBy                  *prometheus.CounterVec
}

func newReconcilerMetrics(reg prometheus.Registerer, table string) (*reconcilerMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := prometheus.Labels{"table": table}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "inboxmill", Subsystem: "reconciler",
			Name: name, Help: help, ConstLabels: labels})
	}
	m := &reconcilerMetrics{
		pending:    gauge("pending", "Records pending reconciliation."),
		oldest:     gauge("oldest_pending_age_seconds", "Age of the least recently updated pending record."),
		unresolved: gauge("unresolved", "Records still unresolved after MaxTries passes."),
		resolvedBy: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "inboxmill", Subsystem: "reconciler",
			Name: "resolved_total", Help: "Records resolved by the reconciler, by verdict.", ConstLabels: labels},
			[]string{"verdict"}),
	}
	for _, c := range []prometheus.Collector{m.pending, m.oldest, m.unresolved, m.resolvedBy} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, errors.New("a reconciler for this table is already registered on this registry")
			}
			return nil, err
		}
	}
	return m, nil
}

func (m *reconcilerMetrics) resolved(v Verdict) {
	if m != nil {
		m.resolvedBy.WithLabelValues(v.String()).Inc()
	}
}

func (m *reconcilerMetrics) setUnresolved(n int) {
	if m != nil {
		m.unresolved.Set(float64(n))
	}
}

func (m *reconcilerMetrics) setPending(st inbox.Stats, now time.Time) {
	if m == nil {
		return
	}
	m.pending.Set(float64(st.Pending))
	if st.OldestPending.IsZero() {
		m.oldest.Set(0)
	} else {
		m.oldest.Set(now.Sub(st.OldestPending).Seconds())
	}
}
