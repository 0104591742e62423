package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/inboxmill/inboxmill/dedup"
)

// growth measures claim latency as the inbox fills: at each size of
// opts.growth (rows already in the table), for each worker count and round,
// fresh events through the transactional middleware. A message's latency here
// ends when its handler starts, that is when the claim is made: key and
// fingerprint, BEGIN and the INSERT into the inbox's primary key, which is
// where size shows. One table serves every size; rows are added between
// sizes and the time that takes is printed as a SEED line.
func (b *bench) growth(ctx context.Context, d dialect) error {
	f, err := b.newFixture(ctx, d, "growth", slices.Max(b.opts.workers)+2)
	if err != nil {
		return err
	}
	defer f.close()
	store, err := f.newStore(ctx)
	if err != nil {
		return err
	}
	m, err := dedup.New(store, dedupConfig(dedup.Transactional{}))
	if err != nil {
		return err
	}
	deliver := m.Middleware(f.inClaimTx)
	var seeded int64
	delivered := 0
	for _, size := range b.opts.growth {
		if size > seeded {
			start := time.Now()
			err := f.seed(ctx, store.Table(), seeded, size, func(done int64) {
				b.logf("growth %s: %d of %d rows seeded after %v", d.name, done, size, time.Since(start).Round(time.Second))
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(b.out, "SEED dialect=%s rows=%d added=%d seconds=%.1f\n", d.name, size, size-seeded,
				time.Since(start).Seconds())
			seeded = size
		}
		// Rounds interleave the worker counts at one size; the median
		// round is reported.
		rounds := map[int][]result{}
		for round := 1; round <= b.opts.rounds; round++ {
			for _, workers := range b.opts.workers {
				warm := newMessages(max(2*workers, 16), nil)
				marks := make([]time.Time, b.opts.msgs)
				msgs := newMessages(b.opts.msgs, marks)
				if err := deliverAll(ctx, workers, warm, deliver); err != nil {
					return fmt.Errorf("warm-up: %w", err)
				}
				r, err := measure(ctx, workers, msgs, deliver, marks)
				if err != nil {
					return err
				}
				delivered += len(warm) + len(msgs)
				if st := m.Stats(); st != (dedup.Stats{Executed: uint64(delivered)}) {
					return fmt.Errorf("middleware stats %+v, want %d executed", st, delivered)
				}
				r.scenario, r.dialect = "growth_"+sizeLabel(size), d.name
				if b.opts.rounds > 1 {
					b.logf("round %d/%d: %s (%s)", round, b.opts.rounds, r, machineLoad())
				}
				rounds[workers] = append(rounds[workers], r)
			}
		}
		for _, workers := range b.opts.workers {
			b.report(median(rounds[workers]))
		}
	}
	return f.expectRows(ctx, f.effects, delivered)
}
