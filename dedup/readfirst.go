package dedup

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
)

// ReadFirst decides whether a transactional delivery looks its record up
// before it begins a transaction.
//
// A duplicate found by a plain read costs one indexed lookup: no
// transaction, no insert, no rollback. A fresh message pays that lookup on
// top of its claim. Reading first therefore pays off when most deliveries
// are duplicates — a replay, a redelivery storm — and costs a round trip
// when few are.
type ReadFirst int

const (
	// ReadFirstAuto (the default) reads first while at least half of the
	// recent deliveries of this middleware were duplicates (an average over
	// about the last 32).
	ReadFirstAuto ReadFirst = iota
	// ReadFirstAlways reads first on every delivery.
	ReadFirstAlways
	// ReadFirstNever never reads first: every delivery claims in a
	// transaction.
	ReadFirstNever
)

func (r ReadFirst) String() string {
	switch r {
	case ReadFirstAuto:
		return "auto"
	case ReadFirstAlways:
		return "always"
	case ReadFirstNever:
		return "never"
	}
	return fmt.Sprintf("ReadFirst(%d)", int(r))
}

// dupRate is an exponentially weighted share of duplicates among recent
// deliveries, in 1/65536ths, updated without locks.
type dupRate struct{ v atomic.Int64 }

const (
	dupRateOne   = 1 << 16
	dupRateShift = 5 // weight 1/32 for each new delivery
)

func (r *dupRate) observe(duplicate bool) {
	sample := int64(0)
	if duplicate {
		sample = dupRateOne
	}
	for {
		old := r.v.Load()
		next := old + (sample-old)>>dupRateShift
		if r.v.CompareAndSwap(old, next) {
			return
		}
	}
}

func (r *dupRate) high() bool { return r.v.Load() >= dupRateOne/2 }

func (d *Deduplicator) shouldReadFirst() bool {
	switch d.tx.ReadFirst {
	case ReadFirstAlways:
		return true
	case ReadFirstNever:
		return false
	}
	return d.dups.high()
}

// readFirst looks the record up outside any transaction. A record that is
// completed or failed is committed and final, so what it says decides the
// delivery without a claim: done reports that. Anything else — no record,
// one still processing or pending, a read error — goes the transactional
// way, whose claim is the arbiter.
// attempt is the record's, when there is one.
func (d *Deduplicator) readFirst(ctx context.Context, id identity) (
	out []*message.Message, outcome Outcome, attempt int64, err error, done bool,
) {
	start := time.Now()
	rec, gerr := d.store.Get(ctx, d.store.DB(), id.ID)
	d.metrics.observeClaim(id.Operation, time.Since(start))
	if gerr != nil {
		return nil, "", 0, nil, false
	}
	if !rec.Status.Finished() {
		return nil, "", rec.Attempt, nil, false
	}
	if !rec.SamePayload(id.hash) {
		return nil, OutcomeConflict, rec.Attempt, &inbox.ConflictError{ID: id.ID, Existing: rec}, true
	}
	out, outcome, err = d.replay(rec)
	return out, outcome, rec.Attempt, err, true
}
