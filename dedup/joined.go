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
	// consuming transaction; the subscriber fetches batches, and acking one
	// message would ack them all. Set SubscribeBatchSize: 1.
	ErrBatchedConsumingTx = errors.New("dedup: several messages share one consuming transaction (set the schema adapter's SubscribeBatchSize to 1)")

	// ErrConsumingTxAborted: an earlier attempt failed in a way that ended
	// the joined consuming transaction (MySQL rolls the whole transaction
	// back on a deadlock); nothing more is written through it. The
	// subscriber must roll it back and fetch the message again.
	ErrConsumingTxAborted = errors.New("dedup: the consuming transaction was aborted by an earlier attempt")
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
	if err := d.txs.claim(tx, msg.UUID); err != nil {
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
		d.txs.abort(tx)
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
