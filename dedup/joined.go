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
	// ErrUnregisteredConsumingTx: the joined consuming transaction was not
	// registered with RegisterConsumingTx by the transport that began it.
	// The middleware cannot know that such a transport waits for a running
	// attempt before it commits: watermill-sql's own subscriber does not
	// (past a message's ack deadline, or when it closes, it commits under
	// the handler, keeping the inbox record without the effect). Build the
	// subscriber with watermillsql.NewSubscriber.
	ErrUnregisteredConsumingTx = errors.New("dedup: the consuming transaction was not registered by its transport " +
		"(build watermill-sql's subscriber with watermillsql.NewSubscriber; another transport calls dedup.RegisterConsumingTx)")

	// ErrBatchedConsumingTx was returned when two messages arrived in one
	// consuming transaction.
	//
	// Deprecated: no longer returned. A registered consuming transaction
	// may carry several messages, and an unregistered one is refused with
	// ErrUnregisteredConsumingTx.
	ErrBatchedConsumingTx = errors.New("dedup: several messages share one consuming transaction")

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
	b := registeredConsumingTx(tx)
	if b == nil {
		return nil, OutcomeRetry, ErrUnregisteredConsumingTx
	}
	// Held for the whole attempt: the transport's own statements and its
	// commit wait for it (ConsumingTx.Wait, End), so they never catch an
	// attempt half done.
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.ended:
		return nil, OutcomeRetry, ErrConsumingTxEnded
	case b.aborted:
		return nil, OutcomeRetry, ErrConsumingTxAborted
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
		b.aborted = true
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

// consumingTxs holds the consuming transactions registered with
// RegisterConsumingTx. Keys are weak: an entry goes away when its
// transaction is garbage.
var consumingTxs sync.Map // weak.Pointer[sql.Tx] -> *ConsumingTx

// ConsumingTx is a consuming transaction registered by the transport that
// began it, which the middleware may join (Transactional.JoinTx). The
// transport promises to call Wait before each statement of its own and
// End before it commits or rolls back, so that it never ends the
// transaction under a running attempt; and, when several messages share
// the transaction, to ack at commit only those that were delivered and
// acked. Package dedup/watermillsql does this for watermill-sql's
// subscriber (watermillsql.NewSubscriber).
type ConsumingTx struct {
	mu      sync.Mutex // held by an attempt running in the transaction
	aborted bool       // an attempt found the transaction ended by the database
	ended   bool       // the transport committed or rolled it back
}

// RegisterConsumingTx registers tx, a consuming transaction the transport
// has just begun, so that the joined middleware runs in it; it refuses an
// unregistered one with ErrUnregisteredConsumingTx.
func RegisterConsumingTx(tx *sql.Tx) *ConsumingTx {
	b := &ConsumingTx{}
	key := weak.Make(tx)
	consumingTxs.Store(key, b)
	runtime.AddCleanup(tx, func(k weak.Pointer[sql.Tx]) { consumingTxs.Delete(k) }, key)
	return b
}

func registeredConsumingTx(tx *sql.Tx) *ConsumingTx {
	if v, ok := consumingTxs.Load(weak.Make(tx)); ok {
		return v.(*ConsumingTx)
	}
	return nil
}

// Wait waits for an attempt running in the transaction to return — the
// subscriber may have stopped waiting for its message, closing or past
// its ack deadline, while the handler still runs — and reports whether
// the transaction may still be written through: false once an attempt
// found it aborted by the database (a MySQL deadlock rolls it back whole;
// a statement sent after that would autocommit).
func (b *ConsumingTx) Wait() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.aborted && !b.ended
}

// End is Wait, after which attempts in the transaction are refused with
// ErrConsumingTxEnded. The transport calls it before it commits or rolls
// back; when it reports false the transport must roll back, not commit.
func (b *ConsumingTx) End() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	ok := !b.aborted && !b.ended
	b.ended = true
	return ok
}
