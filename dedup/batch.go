package dedup

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inboxmill/inboxmill/inbox"
)

// Batch turns on batching in reserve mode (Reserve.Batch): the
// reservations of deliveries handled at the same time go to the database
// in one statement (inbox.Store.ReserveMany), and so do the completions of
// handlers that return at the same time (inbox.Store.CompleteMany). No
// transaction is held across a handler: a reservation is committed before
// its handler runs, and each handler runs under its own lease, at the
// same time as the others, as without batches. Failures, pending
// outcomes and releases are recorded one at a time, as without batches.
//
// When it pays: batches trade parallelism for fewer statements. At most
// Statements reservation statements (and as many completion statements)
// run at once, so with few deliveries in flight, where the database is
// not the bottleneck, they cost throughput; with many (tens per process)
// against a busy database they carry several deliveries per statement
// and commit, and keep scaling where one statement per delivery stops
// (docs/benchmarks.md has the numbers). Each statement needs a
// connection of its own beside the handlers': size the pool for
// 2 × Statements more.
//
// What it costs: a reservation or a completion waits for a statement
// slot while all are busy, and with a positive MaxLinger up to that long
// for others to join. A statement that fails fails every reservation in
// it (each delivery is nacked, as when its own statement fails); a
// completion the shared statement did not record is recorded on its own.
type Batch struct {
	// MaxSize is the most reservations, or completions, one statement
	// takes. Defaults to DefaultGroupMaxSize (64); at most
	// inbox.MaxClaimMany.
	MaxSize int

	// MaxLinger bounds how long a forming batch waits for others to join
	// it, once a statement slot is free: it stops waiting as soon as every
	// delivery that could join has (deliveries not reserved yet, handlers
	// still running), or the batch is full. Defaults to -1, no linger: a
	// batch is whoever joined while the statements in flight kept every
	// slot busy, which costs a lone delivery nothing and adapts to the
	// load. A linger made fewer, larger statements but cost throughput
	// with few deliveries in flight (docs/benchmarks.md).
	MaxLinger time.Duration

	// Statements is how many statements of each kind (reservations,
	// completions) run at once. Items that arrive while every one is busy
	// join the next: fewer make larger batches, more keep more in
	// flight.
	//
	// Defaults to 0, adaptive, one number for both kinds: every item has
	// a statement of its own, as without batches, until a trial of fewer
	// statements at once lowers the deliveries' mean latency, from their
	// reservation to their completion (see Group.Coordinators, which
	// adapts the same way); BatchStats says how many are in force. Where the database has one writer at a time
	// (inbox.Capabilities.SingleWriter: SQLite), whose writer the
	// handlers' writes wait for too, batches measured slower at every
	// load: there the default sends every item alone, as without batches,
	// and says so in the log. A positive number fixes it.
	Statements int
}

func (b Batch) withDefaults() Batch {
	if b.MaxSize == 0 {
		b.MaxSize = DefaultGroupMaxSize
	}
	if b.MaxLinger == 0 {
		b.MaxLinger = -1
	}
	return b // Statements: newReserveBatches, which knows the database
}

func (b Batch) validate() []error {
	return validateGathering("Batch", b.MaxSize, b.MaxLinger, "Statements", b.Statements)
}

// BatchStats describe the batches of a Deduplicator in reserve mode
// with Batch.
type BatchStats struct {
	// ReserveBatches counts the reservation statements sent, and
	// Reservations the reservations they carried; CompleteBatches and
	// Completions the same for completions. Reservations / ReserveBatches
	// is the mean batch.
	ReserveBatches, Reservations uint64
	CompleteBatches, Completions uint64
	// ReservesWaiting and CompletesWaiting are the reservations and
	// completions in batches not sent yet (forming, lingering, or waiting
	// for a statement to end).
	ReservesWaiting, CompletesWaiting int
	// ReserveStatements and CompleteStatements are how many statements of
	// each kind may run at once now (one adaptive number for both); 0 when
	// every item may have its own (the adaptive default before batching
	// paid). Trials and Kept count the adaptive trials of another number
	// and those kept.
	ReserveStatements, CompleteStatements int
	Trials, Kept                          uint64
}

// BatchStats returns the batch counts so far; all zero without
// Reserve.Batch.
func (d *Deduplicator) BatchStats() BatchStats {
	if d.rb == nil {
		return BatchStats{}
	}
	limit, trials, kept := d.rb.ctl.stats()
	return BatchStats{
		ReserveBatches: d.rb.reserves.batches.Load(), Reservations: d.rb.reserves.items.Load(),
		CompleteBatches: d.rb.completes.batches.Load(), Completions: d.rb.completes.items.Load(),
		ReservesWaiting: d.rb.reserves.queued(), CompletesWaiting: d.rb.completes.queued(),
		ReserveStatements: limit, CompleteStatements: limit, Trials: trials, Kept: kept,
	}
}

// waiter is what a delivery waits on for its item of a batch.
type waiter struct {
	done chan struct{}
	err  error
}

func newWaiter() waiter { return waiter{done: make(chan struct{})} }

func (w *waiter) release(err error) {
	w.err = err
	close(w.done)
}

type batchItem interface{ wait() *waiter }

// batcher gathers the items of deliveries that arrive together and hands
// each batch to run, in the call of the delivery that opened it (its
// leader), as many at once as slots allows. run releases every item it
// is given.
type batcher[T batchItem] struct {
	maxSize int
	linger  time.Duration
	slots   *slotPool
	run     func(items []T)

	mu sync.Mutex
	// expected counts deliveries that may still join (announced with
	// expect and not yet joined or withdrawn).
	expected int
	open     *forming[T]
	waiting  int // items joined and not sent yet
	inPool   int // items joined and not released yet

	batches, items atomic.Uint64
}

type forming[T any] struct {
	items []T
	kick  chan struct{}
}

// newBatcher returns a batcher whose statements take slots of slots.
func newBatcher[T batchItem](b Batch, slots *slotPool, run func([]T)) *batcher[T] {
	return &batcher[T]{maxSize: b.MaxSize, linger: b.MaxLinger, slots: slots, run: run}
}

// expect announces a delivery that will join (or withdraw).
func (b *batcher[T]) expect() {
	b.mu.Lock()
	b.expected++
	b.mu.Unlock()
}

// withdraw takes back an expect: the delivery will not join.
func (b *batcher[T]) withdraw() {
	b.mu.Lock()
	b.expected--
	if b.open != nil {
		kickForming(b.open)
	}
	b.mu.Unlock()
}

// queued returns the items joined and not sent yet.
func (b *batcher[T]) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting
}

func kickForming[T any](f *forming[T]) {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// join adds item to the forming batch and waits for its release;
// expected says whether it was announced.
func (b *batcher[T]) join(item T, expected bool) {
	b.mu.Lock()
	if expected {
		b.expected--
	}
	b.inPool++
	f, lead := b.open, false
	if f == nil {
		f, lead = &forming[T]{kick: make(chan struct{}, 1)}, true
		b.open = f
	}
	f.items = append(f.items, item)
	b.waiting++
	if len(f.items) >= b.maxSize {
		b.open = nil
	}
	kickForming(f)
	b.mu.Unlock()
	if lead {
		// In the leader's own call: its item is released with the others
		// when the statement returns, so no goroutine of its own is
		// needed.
		b.lead(f)
	}
	<-item.wait().done
	b.mu.Lock()
	b.inPool--
	b.mu.Unlock()
}

// lead waits for a statement slot, lets the batch fill while it lingers,
// and runs it.
func (b *batcher[T]) lead(f *forming[T]) {
	b.slots.take()
	defer b.slots.put()
	var expired <-chan time.Time
	if b.linger > 0 {
		t := time.NewTimer(b.linger)
		defer t.Stop()
		expired = t.C
	}
	for {
		b.mu.Lock()
		if b.open != f || b.expected <= 0 || expired == nil {
			if b.open == f {
				b.open = nil
			}
			b.mu.Unlock()
			break
		}
		b.mu.Unlock()
		select {
		case <-f.kick:
		case <-expired:
			expired = nil
		}
	}
	items := f.items // no longer open: nobody appends any more
	b.mu.Lock()
	b.waiting -= len(items)
	b.mu.Unlock()
	b.batches.Add(1)
	b.items.Add(uint64(len(items)))
	defer func() {
		// A bug must neither leave deliveries waiting forever nor take
		// the process down from a goroutine no recoverer watches.
		if rec := recover(); rec != nil {
			err := &PanicError{Value: fmt.Sprintf("dedup: batch: %v", rec), Stack: string(debug.Stack())}
			for _, it := range items {
				if w := it.wait(); !closed(w.done) {
					w.release(err)
				}
			}
		}
	}()
	b.run(items)
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// reserveBatches are the two batchers of reserve mode with Batch, and
// the controller of their statements at once: each batcher's slots follow
// ctl, which measures each delivery from its reservation to its
// completion (see Deduplicator.reserve).
type reserveBatches struct {
	ctl       *slotPool
	reserves  *batcher[*reserveItem]
	completes *batcher[*completeItem]
}

type reserveItem struct {
	waiter
	ctx context.Context
	p   inbox.ReserveParams
	res inbox.ReserveResult
	// announced is set when the item got a lease and was announced to
	// the completion batch before its release: its completion is
	// expected from the moment its delivery wakes up.
	announced bool
}

func (it *reserveItem) wait() *waiter { return &it.waiter }

type completeItem struct {
	waiter
	ctx   context.Context // the delivery's, for a completion sent alone
	lease *inbox.Lease
	o     inbox.Outcome
}

func (it *completeItem) wait() *waiter { return &it.waiter }

func newReserveBatches(store *inbox.Store, cfg Batch) *reserveBatches {
	if cfg.Statements == 0 && store.Dialect().Capabilities().SingleWriter {
		// One writer: batches measured slower at every load, and only
		// the trials would show it (docs/benchmarks.md). Every item has
		// a statement of its own, as without batches.
		cfg.Statements = unbounded
	}
	rb := &reserveBatches{ctl: newSlotPool(cfg.Statements, unbounded, poolSize(store))}
	rb.completes = newBatcher(cfg, newFollower(rb.ctl), func(items []*completeItem) { completeBatch(store, items) })
	rb.reserves = newBatcher(cfg, newFollower(rb.ctl), func(items []*reserveItem) { reserveBatch(store, rb.completes, items) })
	return rb
}

// reserveBatch reserves the items' intents: with Reserve when one is
// left (a statement of one row, prepared where the store prepares), with
// one ReserveMany otherwise. An item whose context ended is released
// without a reservation. Each item that got a lease is announced to
// completes before it is released, so that a completion batch formed by
// a fast handler waits for the handlers of its reservation batch.
func reserveBatch(store *inbox.Store, completes *batcher[*completeItem], items []*reserveItem) {
	live := items[:0:0]
	for _, it := range items {
		if err := it.ctx.Err(); err != nil {
			it.release(err)
			continue
		}
		live = append(live, it)
	}
	var res []inbox.ReserveResult
	var err error
	switch len(live) {
	case 0:
		return
	case 1:
		// Alone: the statement serves this delivery only, under its own
		// context, as without batches.
		var r inbox.ReserveResult
		r, err = store.Reserve(live[0].ctx, live[0].p)
		res = []inbox.ReserveResult{r}
	default:
		// The statement outlives any one delivery's context (a delivery
		// that goes away meanwhile gets its reservation, which its lease
		// expires), but not a database that stopped answering: then every
		// delivery in it is nacked.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(live[0].ctx), finishTimeout)
		defer cancel()
		ps := make([]inbox.ReserveParams, len(live))
		for i, it := range live {
			ps[i] = it.p
		}
		res, err = store.ReserveMany(ctx, ps)
	}
	if err != nil {
		for _, it := range live {
			it.release(err)
		}
		return
	}
	for i, it := range live {
		it.res = res[i]
		if res[i].Err == nil && res[i].Lease != nil {
			it.announced = true
			completes.expect()
		}
	}
	for i, it := range live {
		it.release(res[i].Err)
	}
}

// completeBatch records the items' completions with one CompleteMany,
// or a completion alone as without batches.
func completeBatch(store *inbox.Store, items []*completeItem) {
	if len(items) == 1 {
		items[0].release(items[0].lease.Complete(items[0].ctx, items[0].o))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	cs := make([]inbox.Completion, len(items))
	for i, it := range items {
		cs[i] = inbox.Completion{Lease: it.lease, Outcome: it.o}
	}
	for i, err := range store.CompleteMany(ctx, cs) {
		items[i].release(err)
	}
}

// reserveIntent reserves p: in a batch with Reserve.Batch (first says
// whether the delivery announced it), with its own statement otherwise.
// announced says whether the delivery's completion is now expected by the
// completion batch: it must then join it or withdraw.
func (d *Deduplicator) reserveIntent(ctx context.Context, p inbox.ReserveParams, first bool) (
	res inbox.ReserveResult, announced bool, err error,
) {
	if d.rb == nil {
		res, err = d.store.Reserve(ctx, p)
		return res, false, err
	}
	it := &reserveItem{waiter: newWaiter(), ctx: ctx, p: p}
	d.rb.reserves.join(it, first)
	if it.err != nil {
		if it.announced {
			// Released by a failure after the announcement (a bug caught
			// in the batch): no completion follows.
			d.rb.completes.withdraw()
		}
		return inbox.ReserveResult{}, false, it.err
	}
	return it.res, it.announced, nil
}

// completeIntent records a completion through lease: in a batch with
// Reserve.Batch (expected says whether the delivery announced it), with
// its own statement otherwise.
func (d *Deduplicator) completeIntent(ctx context.Context, lease *inbox.Lease, o inbox.Outcome, expected bool) error {
	if d.rb == nil {
		return lease.Complete(ctx, o)
	}
	it := &completeItem{waiter: newWaiter(), ctx: ctx, lease: lease, o: o}
	d.rb.completes.join(it, expected)
	return it.err
}
