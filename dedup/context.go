package dedup

import (
	"context"
	"database/sql"

	"github.com/inboxmill/inboxmill/inbox"
)

type ctxKey int

const (
	txKey ctxKey = iota
	claimKey
	// deliverySpanKey holds the delivery's span while the middleware runs
	// (the current span of the context may be a phase's).
	deliverySpanKey
)

// TxFromContext returns the transaction the middleware claimed the message
// in. Inside the handler, do the business writes through it: they then
// commit together with the inbox record, or not at all.
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txKey).(*sql.Tx)
	return tx, ok && tx != nil
}

// Claim describes the intent a handler is running for.
type Claim struct {
	inbox.ID
	// Attempt is the record's fencing token: 1 for the first claim.
	Attempt int64
	// IdempotencyKey is stable for every attempt of the same intent and
	// safe to send to a provider as its idempotency key: ID.IdempotencyKey.
	IdempotencyKey string
}

// ClaimFromContext returns the claim of the message being handled.
func ClaimFromContext(ctx context.Context) (Claim, bool) {
	c, ok := ctx.Value(claimKey).(Claim)
	return c, ok
}

func withClaim(ctx context.Context, tx *sql.Tx, c Claim) context.Context {
	if tx != nil {
		ctx = context.WithValue(ctx, txKey, tx)
	}
	return context.WithValue(ctx, claimKey, c)
}
