package console

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmill/inboxmill/inbox"
)

// overviewCollector reads [inbox.Store.Overview] on every scrape, so the
// gauges are as fresh as the scrape and cost nothing between scrapes.
type overviewCollector struct {
	h                                                          *handler
	up, records, oldestPending, oldestExpiredLease, purge, lag *prometheus.Desc
}

func newOverviewCollector(h *handler) *overviewCollector {
	table := prometheus.Labels{"table": h.store.Table()}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("inboxmill_inbox_"+name, help, labels, table)
	}
	return &overviewCollector{
		h:       h,
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

func (c *overviewCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.h.cfg.Timeout)
	defer cancel()
	ov, err := c.h.store.Overview(ctx)
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
