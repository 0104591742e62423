package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
)

// growthInbox is one inbox table of the growth scenario, for one key order.
type growthInbox struct {
	keys      keyOrder
	layout    string // layoutPlain or layoutPartitioned
	store     *inbox.Store
	m         *dedup.Deduplicator
	deliver   message.HandlerFunc
	seeded    int64
	delivered int
}

// growth measures claim latency as the inbox fills: at each size of
// opts.growth (rows already in the table), for each key order of
// opts.keys, worker count and round, fresh events through the
// transactional middleware. A message's latency here ends when its handler
// starts, that is when the claim is made: key and fingerprint, BEGIN and
// the INSERT into the inbox's primary key, which is where size shows. Each
// key order has one table for every size, its seeded rows and its measured
// events keyed alike (uuidv7: the seeded keys sort in insertion order and
// before every measured one, as older events' IDs would); rows are added
// between sizes and the time that takes is printed as a SEED line. The
// tables share one connection pool and the business table.
func (b *bench) growth(ctx context.Context, d dialect) error {
	f, err := b.newFixture(ctx, d, "growth", slices.Max(b.opts.workers)+2)
	if err != nil {
		return err
	}
	defer f.close()
	// Seeded uuidv7 keys end a second before now, whatever the size.
	origin := time.Now().UnixMilli() - slices.Max(b.opts.growth) - 1000
	var inboxes []*growthInbox
	for _, layout := range b.opts.layouts {
		if layout == layoutPartitioned && d.name != "pg" {
			continue
		}
		for _, keys := range b.opts.keys {
			newStore := f.newStore
			if layout == layoutPartitioned {
				newStore = f.newPartitionedStore
			}
			store, err := newStore(ctx)
			if err != nil {
				return err
			}
			m, err := dedup.New(store, dedupConfig(dedup.Transactional{}))
			if err != nil {
				return err
			}
			inboxes = append(inboxes, &growthInbox{keys: keys, layout: layout, store: store, m: m,
				deliver: m.Middleware(f.inClaimTx)})
		}
	}
	for _, size := range b.opts.growth {
		for _, in := range inboxes {
			if size <= in.seeded {
				continue
			}
			start := time.Now()
			undo, err := f.undoBacklog(ctx)
			if err != nil {
				return err
			}
			rows := seedRows{keys: in.keys, origin: origin}
			if in.layout == layoutPartitioned {
				rows.bucket = bucketSpread
			}
			err = f.seed(ctx, f.db, in.store.Table(), in.seeded, size, rows, func(done int64) {
				b.logf("growth %s (%s keys, %s): %d of %d rows seeded after %v", d.name, in.keys, in.layout, done, size,
					time.Since(start).Round(time.Second))
			})
			if err == nil {
				err = f.settle(ctx, in.store.Table(), undo)
			}
			if err != nil {
				return err
			}
			line := fmt.Sprintf("SEED dialect=%s rows=%d added=%d seconds=%.1f", d.name, size, size-in.seeded,
				time.Since(start).Seconds())
			if in.keys != keysRandom {
				line += " keys=" + string(in.keys)
			}
			if in.layout != layoutPlain {
				line += " layout=" + in.layout
			}
			fmt.Fprintln(b.out, line)
			in.seeded = size
		}
		// Rounds interleave the key orders and worker counts at one size;
		// the median round is reported.
		type cell struct {
			in      *growthInbox
			workers int
		}
		rounds := map[cell][]result{}
		for round := 1; round <= b.opts.rounds; round++ {
			for _, in := range inboxes {
				for _, workers := range b.opts.workers {
					warm := newKeyedMessages(max(2*workers, 16), nil, in.keys)
					marks := make([]time.Time, b.opts.msgs)
					msgs := newKeyedMessages(b.opts.msgs, marks, in.keys)
					if err := deliverAll(ctx, workers, warm, in.deliver); err != nil {
						return fmt.Errorf("warm-up: %w", err)
					}
					r, err := measure(ctx, workers, msgs, in.deliver, marks)
					if err != nil {
						return err
					}
					in.delivered += len(warm) + len(msgs)
					if st := in.m.Stats(); st != (dedup.Stats{Executed: uint64(in.delivered)}) {
						return fmt.Errorf("middleware stats %+v, want %d executed", st, in.delivered)
					}
					r.scenario, r.dialect = in.keys.scenario(in.base(), size), d.name
					if b.opts.rounds > 1 {
						b.logf("round %d/%d: %s (%s)", round, b.opts.rounds, r, machineLoad())
					}
					rounds[cell{in, workers}] = append(rounds[cell{in, workers}], r)
				}
			}
		}
		for _, in := range inboxes {
			for _, workers := range b.opts.workers {
				b.report(median(rounds[cell{in, workers}]))
			}
		}
	}
	delivered := 0
	for _, in := range inboxes {
		delivered += in.delivered
	}
	return f.expectRows(ctx, f.effects, delivered)
}

// base is the scenario name of the inbox's measurements before the key
// order and size: growth, or growth_partitioned.
func (in *growthInbox) base() string {
	if in.layout == layoutPlain {
		return "growth"
	}
	return "growth_" + in.layout
}
