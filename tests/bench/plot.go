package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// chart is one SVG the --plot flag writes: lines over worker counts (or
// partitions), one per series.
type chart struct {
	file, title, x, y string
	logY              bool
	series            []series
	// one draws a dashed line at y = 1 (ratios: parity with the baseline).
	one bool
}

type series struct {
	name string
	pts  plotter.XYs
}

// plotScenarios are the per-dialect scenarios the throughput and latency
// charts show, and plotRatios the ratios the ratio chart shows, in the
// order of their legends.
var (
	plotScenarios = []string{"plain", "inboxmill", "inboxmill_group", "inboxmill_group_pgx", "inboxmill_reserve",
		"inboxmill_reserve_batch", "watermill_dedup", "select_then_insert"}
	plotRatios = []string{"inboxmill_vs_plain", "group_vs_plain", "group_pgx_vs_plain", "reserve_vs_plain",
		"reserve_batch_vs_plain", "reserve_batch_vs_reserve"}
	plotKafka       = []string{"plain", "inboxmill", "group", "group_pgx", "parallel_plain", "parallel", "parallel_group", "parallel_group_pgx"}
	plotKafkaRatios = []string{"kafka_inboxmill_vs_plain", "kafka_group_vs_plain", "kafka_group_pgx_vs_plain",
		"kafka_parallel_vs_plain", "kafka_parallel_group_vs_plain", "kafka_parallel_group_pgx_vs_plain"}
)

// charts derives the run's charts: per dialect, throughput and p99
// against workers, one line per scenario, and the ratios to the bare
// handler; for Kafka the same against partitions.
func (b *bench) charts() []chart {
	var out []chart
	ratios := b.ratios()
	ratioSeries := func(names []string, dialect string) []series {
		var ss []series
		for _, name := range names {
			s := series{name: name}
			for _, r := range ratios {
				if r.name == name && r.dialect == dialect {
					s.pts = append(s.pts, plotter.XY{X: float64(r.workers), Y: r.value})
				}
			}
			if len(s.pts) > 0 {
				slices.SortFunc(s.pts, func(a, c plotter.XY) int { return int(a.X - c.X) })
				ss = append(ss, s)
			}
		}
		return ss
	}
	resultSeries := func(scenarios []string, prefix, dialect string, y func(result) float64) []series {
		var ss []series
		for _, sc := range scenarios {
			s := series{name: sc}
			for _, r := range b.results {
				if r.scenario == prefix+sc && r.dialect == dialect {
					s.pts = append(s.pts, plotter.XY{X: float64(r.workers), Y: y(r)})
				}
			}
			if len(s.pts) > 0 {
				slices.SortFunc(s.pts, func(a, c plotter.XY) int { return int(a.X - c.X) })
				ss = append(ss, s)
			}
		}
		return ss
	}
	perSec := func(r result) float64 { return r.perSec }
	p99 := func(r result) float64 { return micros(r.p99) / 1000 }
	for _, d := range b.opts.dialects {
		add := func(c chart) {
			if len(c.series) > 0 {
				out = append(out, c)
			}
		}
		add(chart{file: d + "-throughput.svg", title: d + ": throughput", x: "deliveries in flight (workers)", y: "messages/s",
			series: resultSeries(plotScenarios, "", d, perSec)})
		add(chart{file: d + "-p99.svg", title: d + ": p99 latency", x: "deliveries in flight (workers)", y: "p99 (ms)", logY: true,
			series: resultSeries(plotScenarios, "", d, p99)})
		add(chart{file: d + "-ratio.svg", title: d + ": throughput against the bare handler", x: "deliveries in flight (workers)",
			y: "ratio", one: true, series: ratioSeries(plotRatios, d)})
		add(chart{file: d + "-kafka-throughput.svg", title: d + ": through Kafka", x: "partitions", y: "messages/s",
			series: resultSeries(plotKafka, "kafka_", d, perSec)})
		add(chart{file: d + "-kafka-ratio.svg", title: d + ": through Kafka, against the bare handler on watermill-kafka",
			x: "partitions", y: "ratio", one: true, series: ratioSeries(plotKafkaRatios, d)})
	}
	return out
}

// writePlots writes the charts into dir as SVG files and returns their
// names.
func (b *bench) writePlots(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, c := range b.charts() {
		p, err := c.plot()
		if err != nil {
			return files, fmt.Errorf("%s: %w", c.file, err)
		}
		path := filepath.Join(dir, c.file)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return files, fmt.Errorf("%s: %w", c.file, err)
		}
		files = append(files, path)
	}
	return files, nil
}

func (c chart) plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.title
	p.X.Label.Text = c.x
	p.Y.Label.Text = c.y
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = workerTicks{}
	if c.logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	} else {
		p.Y.Min = 0
	}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	for i, s := range c.series {
		l, pts, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / 7)
		l.Width = vg.Points(1.5)
		pts.Color = l.Color
		pts.Shape = plotutil.Shape(i)
		p.Add(l, pts)
		p.Legend.Add(strings.ReplaceAll(s.name, "_", " "), l, pts)
	}
	if c.one {
		xmin, xmax := math.Inf(1), math.Inf(-1)
		for _, s := range c.series {
			for _, pt := range s.pts {
				xmin, xmax = math.Min(xmin, pt.X), math.Max(xmax, pt.X)
			}
		}
		one, err := plotter.NewLine(plotter.XYs{{X: xmin, Y: 1}, {X: xmax, Y: 1}})
		if err != nil {
			return nil, err
		}
		one.Color = color.Gray{Y: 90}
		one.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(one)
	}
	return p, nil
}

// workerTicks marks the powers of two, where worker counts are.
type workerTicks struct{}

func (workerTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for v := 1.0; v <= hi*1.0001; v *= 2 {
		if v >= lo*0.9999 {
			ts = append(ts, plot.Tick{Value: v, Label: fmt.Sprint(v)})
		}
	}
	return ts
}
