package console

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
)

// The overview's chart of outcomes over time: the records that are
// completed, failed or pending now, by when they last changed
// ([inbox.Store.Activity]), drawn by the server as an SVG of stacked
// bars. It needs no script and no inline style: the bars are SVG
// attributes and classes of the stylesheet, and each bar's <title> is its
// tooltip.

// activityWindow is a span of the chart: Buckets bars of Width each, the
// last one holding now.
type activityWindow struct {
	Name    string
	Label   string
	Width   time.Duration
	Buckets int
	// TickEvery is how many bars apart the time axis is labelled, and
	// TickFormat how.
	TickEvery  int
	TickFormat string
}

var activityWindows = map[string]activityWindow{
	"":    {Name: "24h", Label: "last 24 hours, by hour", Width: time.Hour, Buckets: 24, TickEvery: 6, TickFormat: "15:04"},
	"24h": {Name: "24h", Label: "last 24 hours, by hour", Width: time.Hour, Buckets: 24, TickEvery: 6, TickFormat: "15:04"},
	"7d":  {Name: "7d", Label: "last 7 days, by 6 hours", Width: 6 * time.Hour, Buckets: 28, TickEvery: 4, TickFormat: "Mon 15h"},
}

// The chart's geometry, in SVG units. The SVG stretches to the panel's
// width and a fixed height (preserveAspectRatio none), so it holds no
// text: the axis labels are HTML, which keeps them readable on a phone.
const (
	activitySlot  = 10 // per bar, with a gap of 2
	activityPlotH = 100
)

// activityOutcomes are the statuses the chart stacks, bottom up.
var activityOutcomes = []inbox.Status{inbox.StatusCompleted, inbox.StatusFailed, inbox.StatusPending}

type activityChart struct {
	Window string // "24h" or "7d"
	Label  string
	W, H   int // the viewBox
	Bars   []activityBar
	Ticks  []string // the time axis, one label every TickEvery bars
	NTicks int
	Max    int64
	Totals []activityTotal
	Err    string
}

type activityBar struct {
	Start                      time.Time
	X, W                       int
	Segments                   []activitySegment
	Completed, Failed, Pending int64
	Title                      string
}

type activitySegment struct {
	Y, H  int
	Class string
}

type activityTotal struct {
	Status inbox.Status
	N      int64
}

// activity reads and lays out the chart for win ending at now. A failed
// read is an empty chart that says so: the rest of the overview is worth
// showing.
func (h *handler) activity(ctx context.Context, win activityWindow, now time.Time) activityChart {
	c := activityChart{Window: win.Name, Label: win.Label, W: win.Buckets * activitySlot, H: activityPlotH,
		NTicks: win.Buckets / win.TickEvery}
	since := now.Truncate(win.Width).Add(win.Width - time.Duration(win.Buckets)*win.Width)
	buckets, err := h.store.Activity(ctx, inbox.ActivityParams{Since: since, Width: win.Width, Buckets: win.Buckets})
	if err != nil {
		h.log.Error("console: reading the activity", "error", err)
		c.Err = "The activity could not be read. The console's log has the error."
		return c
	}
	totals := map[inbox.Status]int64{}
	for _, bk := range buckets {
		var n int64
		for _, s := range activityOutcomes {
			n += bk.Counts[s]
			totals[s] += bk.Counts[s]
		}
		c.Max = max(c.Max, n)
	}
	for _, s := range activityOutcomes {
		c.Totals = append(c.Totals, activityTotal{Status: s, N: totals[s]})
	}
	for i, bk := range buckets {
		bar := activityBar{Start: bk.Start.UTC(), X: i*activitySlot + 1, W: activitySlot - 2,
			Completed: bk.Counts[inbox.StatusCompleted], Failed: bk.Counts[inbox.StatusFailed], Pending: bk.Counts[inbox.StatusPending]}
		y := activityPlotH
		for _, s := range activityOutcomes {
			n := bk.Counts[s]
			if n == 0 || c.Max == 0 {
				continue
			}
			hgt := int(float64(activityPlotH) * float64(n) / float64(c.Max))
			hgt = max(hgt, 2) // a record is always visible
			y -= hgt
			bar.Segments = append(bar.Segments, activitySegment{Y: y, H: hgt, Class: "seg " + statusClassOf(s)})
		}
		bar.Title = fmt.Sprintf("%s – %s UTC: %d completed, %d failed, %d pending", bk.Start.UTC().Format("Mon 02 Jan 15:04"),
			bk.End.UTC().Format("15:04"), bar.Completed, bar.Failed, bar.Pending)
		c.Bars = append(c.Bars, bar)
		if i%win.TickEvery == 0 {
			c.Ticks = append(c.Ticks, bk.Start.UTC().Format(win.TickFormat))
		}
	}
	return c
}

func statusClassOf(s inbox.Status) string { return "st-" + string(s) }
