package console

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmill/inboxmill/inbox"
)

// overviewCollector serves gauges read from [inbox.Store.Overview], which
// counts the whole table: it reads it again only when the last read is
// older than Config.MetricsMaxAge, one read at a time, so that scrapes
// close together (several Prometheus servers, a dashboard, a curl in a
// loop) share one read.
type overviewCollector struct {
	h                                                          *handler
	up, records, oldestPending, oldestExpiredLease, purge, lag *prometheus.Desc

	// sem is held by the one caller reading the overview; the others wait
	// for it (or for their context) and take what it read.
	sem chan struct{}
	// Guarded by sem.
	last   inbox.Overview
	lastAt time.Time // zero before the first read
	err    error
	// onRead, when set, runs before each read of the overview (tests
	// count reads with it).
	onRead func()
}

func newOverviewCollector(h *handler) *overviewCollector {
	table := prometheus.Labels{"table": h.store.Table()}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("inboxmill_inbox_"+name, help, labels, table)
	}
	return &overviewCollector{
		h:       h,
		sem:     make(chan struct{}, 1),
		up:      d("up", "1 when the last scrape read the inbox table, 0 when the database failed (the other inbox gauges are then absent)."),
		records: d("records", "Records in the inbox table, by operation and status.", "operation", "status"),
		oldestPending: d("oldest_pending_age_seconds",
			"Age of the oldest pending record (since it was claimed); 0 when none is pending. Alert when it grows: pending records wait for an operator or a reconciler."),
		oldestExpiredLease: d("oldest_expired_lease_age_seconds",
			"Age of the oldest processing record whose lease has expired (since it was claimed); 0 when none. Such a record waits for a redelivery to take it over."),
		purge: d("awaiting_purge", "Finished records past their expiry that a purge may delete."),
		lag:   d("purge_lag_seconds", "How long the oldest expired finished record has waited for a purge; 0 when none."),
	}
}

func (c *overviewCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.records, c.oldestPending, c.oldestExpiredLease, c.purge, c.lag} {
		ch <- d
	}
}

// read returns the overview, read at most Config.MetricsMaxAge ago: the
// last one, or a new one read under ctx and Config.Timeout when it is
// older. A failure is kept like an overview, unless it is ctx's own end,
// which says nothing of the database.
func (c *overviewCollector) read(ctx context.Context) (inbox.Overview, error) {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return inbox.Overview{}, ctx.Err()
	}
	defer func() { <-c.sem }()
	if !c.lastAt.IsZero() && time.Since(c.lastAt) < c.h.cfg.MetricsMaxAge {
		return c.last, c.err
	}
	if c.onRead != nil {
		c.onRead()
	}
	rctx, cancel := context.WithTimeout(ctx, c.h.cfg.Timeout)
	defer cancel()
	ov, err := c.h.store.Overview(rctx)
	if err != nil && ctx.Err() != nil {
		return inbox.Overview{}, err
	}
	c.last, c.lastAt, c.err = ov, time.Now(), err
	return ov, err
}

// metrics serves /metrics: it reads the overview under the scrape's
// context first, so that the collector, which has none, finds it fresh.
func (h *handler) metrics(next http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := h.gauges.read(r.Context()); err != nil && r.Context().Err() != nil {
			return // the scraper is gone
		}
		next.ServeHTTP(w, r)
	}
}

// Collect sends the gauges of the overview [overviewCollector.read]
// returns. Served by /metrics it finds the one the scrape just read; a
// registry gathered elsewhere reads it here, bounded by Config.Timeout.
func (c *overviewCollector) Collect(ch chan<- prometheus.Metric) {
	ov, err := c.read(context.Background())
	if err != nil {
		c.h.log.Error("console metrics: reading the overview", "error", err)
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.up, 1)
	// Every status of every operation, zeros included, so that a rule on
	// the pending count has a series to read before the first one appears.
	counts := map[string]map[inbox.Status]int64{}
	for _, n := range ov.Counts {
		if counts[n.Operation] == nil {
			counts[n.Operation] = map[inbox.Status]int64{}
		}
		counts[n.Operation][n.Status] += n.N
	}
	for op, byStatus := range counts {
		for _, s := range statuses {
			gauge(c.records, float64(byStatus[s]), op, string(s))
		}
	}
	age := func(r *inbox.Record) float64 {
		if r == nil || !ov.Now.After(r.CreatedAt) {
			return 0
		}
		return ov.Now.Sub(r.CreatedAt).Seconds()
	}
	gauge(c.oldestPending, age(ov.OldestPending))
	gauge(c.oldestExpiredLease, age(ov.OldestExpiredLease))
	gauge(c.purge, float64(ov.AwaitingPurge))
	lag := 0.0
	if !ov.OldestExpired.IsZero() && ov.Now.After(ov.OldestExpired) {
		lag = ov.Now.Sub(ov.OldestExpired).Seconds()
	}
	gauge(c.lag, lag)
}
