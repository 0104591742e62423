package dedup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"weak"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
)

// TxJoiner finds the transaction a message was consumed in, for
// Transactional.JoinTx. Package dedup/watermillsql has the one for
// watermill-sql's subscriber.
type TxJoiner func(ctx context.Context) (*sql.Tx, bool)

var (
	// ErrBatchedConsumingTx: two different messages arrived in one joined
	// consuming transaction that was not registered with RegisterBatchedTx;
	// watermill-sql's queue adapters ack every row the subscriber fetched,
	// delivered or not. Set SubscribeBatchSize: 1, or build the subscriber
	// with watermillsql.NewSubscriber, which acks only what was delivered.
	ErrBatchedConsumingTx = errors.New("dedup: several messages share one consuming transaction whose subscriber acks every fetched row " +
		"(set the schema adapter's SubscribeBatchSize to 1, or build the subscriber with watermillsql.NewSubscriber)")

	// ErrConsumingTxAborted: an earlier attempt failed in a way that ended
	// the joined consuming transaction (MySQL rolls the whole transaction
	// back on a deadlock); nothing more is written through it. The
	// subscriber must roll it back and fetch the message again.
	ErrConsumingTxAborted = errors.New("dedup: the consuming transaction was aborted by an earlier attempt")

	// ErrConsumingTxEnded: the subscriber stopped waiting for this message
	// (it is closing, or the ack deadline passed) and ended the registered
	// consuming transaction before the attempt began. Nothing was written;
	// the message is delivered again in a later transaction.
	ErrConsumingTxEnded = errors.New("dedup: the consuming transaction already ended")
)

// joined runs one delivery inside the consuming transaction tx, each
// attempt under a savepoint: watermill-sql does not roll the transaction
// back on a nack but resends the message in it, so a failed attempt's
// writes (and its inbox record) must be undone by rolling back to the
// savepoint, or they would commit with the next attempt's ack.
func (d *Deduplicator) joined(ctx context.Context, tx *sql.Tx, msg *message.Message, h message.HandlerFunc, id identity) (
	[]*message.Message, Outcome, error,
) {
	setDeliveryBool(ctx, attrJoined, true)
	b := registeredBatchedTx(tx)
	if b != nil {
		// Held for the whole attempt: the transport's ack statement and
		// commit wait for it (BatchedTx.Wait, End), so they never catch an
		// attempt half done.
		b.mu.Lock()
		defer b.mu.Unlock()
		switch {
		case b.ended:
			return nil, OutcomeRetry, ErrConsumingTxEnded
		case b.aborted:
			return nil, OutcomeRetry, ErrConsumingTxAborted
		}
	} else if err := d.txs.claim(tx, msg.UUID); err != nil {
		return nil, OutcomeRetry, err
	}
	var (
		out     []*message.Message
		outcome Outcome
		commit  span // storing the output and releasing the savepoint
	)
	err := d.store.WithSavepoint(ctx, tx, func() error {
		var err error
		out, outcome, _, commit, err = d.inTx(ctx, tx, tx, msg, h, id)
		return err
	})
	if err != nil {
		commit.end(string(OutcomeRetry), 0, err)
	} else {
		commit.end(string(outcome), 0, nil)
	}
	switch {
	case err == nil:
		return out, outcome, nil
	case errors.Is(err, inbox.ErrTxAborted):
		// The savepoint is gone: the database ended the transaction (a
		// MySQL deadlock rolls it back whole). Writing on would autocommit.
		if b != nil {
			b.aborted = true
		} else {
			d.txs.abort(tx)
		}
		return nil, OutcomeRetry, fmt.Errorf("%w: %w", ErrConsumingTxAborted, err)
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		// Recorded in the consuming transaction, so it commits with the
		// ack that the poison queue's handling causes.
		fctx, sp := d.startPhase(ctx, spanFail, id)
		if _, cerr := d.store.Claim(fctx, tx, d.permanentClaim(msg, id, pe)); cerr != nil {
			// Unrecorded, it must not reach the poison queue: nacked, the
			// redelivery records it.
			sp.end(string(OutcomeRetry), 0, cerr)
			return nil, OutcomeRetry, fmt.Errorf("dedup: record the permanent failure %q: %w", pe.Error(), cerr)
		}
		sp.end(string(OutcomeFailed), 0, nil)
		outcome = OutcomeFailed
	}
	return nil, outcome, err
}

// txRegistry remembers, per joined consuming transaction, which message it
// carries and whether it was aborted. Keys are weak: an entry goes away
// when its transaction is garbage.
type txRegistry struct {
	m sync.Map // weak.Pointer[sql.Tx] -> *txState
}

type txState struct {
	mu      sync.Mutex
	uuid    string
	aborted bool
}

func (r *txRegistry) state(tx *sql.Tx) *txState {
	key := weak.Make(tx)
	if v, ok := r.m.Load(key); ok {
		return v.(*txState)
	}
	v, loaded := r.m.LoadOrStore(key, &txState{})
	if !loaded {
		runtime.AddCleanup(tx, func(k weak.Pointer[sql.Tx]) { r.m.Delete(k) }, key)
	}
	return v.(*txState)
}

// claim records that tx carries the message uuid; a redelivery of the same
// message (a nack resends it in the same transaction) is fine, another
// message is not.
func (r *txRegistry) claim(tx *sql.Tx, uuid string) error {
	st := r.state(tx)
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.aborted:
		return ErrConsumingTxAborted
	case st.uuid == "":
		st.uuid = uuid
	case st.uuid != uuid:
		return ErrBatchedConsumingTx
	}
	return nil
}

func (r *txRegistry) abort(tx *sql.Tx) {
	st := r.state(tx)
	st.mu.Lock()
	st.aborted = true
	st.mu.Unlock()
}

// batchedTxs holds the consuming transactions registered with
// RegisterBatchedTx. Keys are weak: an entry goes away when its
// transaction is garbage.
var batchedTxs sync.Map // weak.Pointer[sql.Tx] -> *BatchedTx

// BatchedTx is a consuming transaction that several messages may share,
// registered by the transport that began it. The transport promises to
// ack, at commit, only the messages that were delivered and acked, and to
// call Wait before each statement of its own and End before it ends the
// transaction. Package dedup/watermillsql does this for watermill-sql's
// subscriber (watermillsql.NewSubscriber).
type BatchedTx struct {
	mu      sync.Mutex // held by an attempt running in the transaction
	aborted bool       // an attempt found the transaction ended by the database
	ended   bool       // the transport committed or rolled it back
}

// RegisterBatchedTx registers tx, a consuming transaction the transport
// has just begun, so that the joined middleware accepts several messages
// in it instead of refusing the second with ErrBatchedConsumingTx.
func RegisterBatchedTx(tx *sql.Tx) *BatchedTx {
	b := &BatchedTx{}
	key := weak.Make(tx)
	batchedTxs.Store(key, b)
	runtime.AddCleanup(tx, func(k weak.Pointer[sql.Tx]) { batchedTxs.Delete(k) }, key)
	return b
}

func registeredBatchedTx(tx *sql.Tx) *BatchedTx {
	if v, ok := batchedTxs.Load(weak.Make(tx)); ok {
		return v.(*BatchedTx)
	}
	return nil
}

// Wait waits for an attempt running in the transaction to return — the
// subscriber may have stopped waiting for its message, closing or past
// its ack deadline, while the handler still runs — and reports whether
// the transaction may still be written through: false once an attempt
// found it aborted by the database (a MySQL deadlock rolls it back whole;
// a statement sent after that would autocommit).
func (b *BatchedTx) Wait() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.aborted && !b.ended
}

// End is Wait, after which attempts in the transaction are refused with
// ErrConsumingTxEnded. The transport calls it before it commits or rolls
// back; when it reports false the transport must roll back, not commit.
func (b *BatchedTx) End() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	ok := !b.aborted && !b.ended
	b.ended = true
	return ok
}
