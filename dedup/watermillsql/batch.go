package watermillsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/inboxmill/inboxmill/dedup"
)

// NewSubscriber builds watermill-sql's subscriber so that the middleware
// may join consuming transactions that carry several messages (a schema
// adapter's SubscribeBatchSize above 1):
//
//   - its offsets adapter is wrapped with [AckDelivered], so the commit
//     acks only the messages that were delivered and acked, not every row
//     the batch fetched;
//   - every transaction it begins is registered with
//     [dedup.RegisterConsumingTx]; its ack statement and its commit wait for
//     an attempt still running in it (the subscriber stops waiting for a
//     message when it closes or the ack deadline passes, while the handler
//     may still be writing), and a transaction an attempt found aborted by
//     the database is rolled back instead of acked.
//
// db is the *sql.DB of the queue (and of the inbox). config is passed on
// unchanged otherwise; its OffsetsAdapter must be set.
func NewSubscriber(db wsql.SQLBeginner, config wsql.SubscriberConfig, logger watermill.LoggerAdapter) (*wsql.Subscriber, error) {
	if db == nil {
		return nil, errors.New("watermillsql: db is nil")
	}
	if config.OffsetsAdapter == nil {
		return nil, errors.New("watermillsql: the subscriber config has no OffsetsAdapter")
	}
	config.OffsetsAdapter = AckDelivered(config.OffsetsAdapter)
	return wsql.NewSubscriber(beginner{db: db}, config, logger)
}

// AckDelivered wraps an offsets adapter so that its ack statement covers
// only the rows whose messages were delivered and acked.
//
// watermill-sql's subscriber delivers a fetched batch one message at a
// time and stops at the first that is not acked (it is closing, or the
// message's ack deadline passed); its ack statement is then built from the
// last acked row (AckMessageQueryParams.LastRow) and every fetched row
// (Rows). The queue adapters (PostgreSQLQueueOffsetsAdapter,
// MySQLQueueOffsetsAdapter) ack Rows, undelivered ones included, so those
// are lost; the offset adapters (DefaultPostgreSQLOffsetsAdapter,
// DefaultMySQLOffsetsAdapter) store LastRow's offset and are safe already.
// AckDelivered passes the inner adapter only the rows up to LastRow, the
// ones acked. An adapter that acks anything else than Rows or up to
// LastRow is not made safe by it.
func AckDelivered(inner wsql.OffsetsAdapter) wsql.OffsetsAdapter {
	if a, ok := inner.(ackDelivered); ok {
		return a
	}
	return ackDelivered{inner}
}

type ackDelivered struct {
	wsql.OffsetsAdapter
}

func (a ackDelivered) AckMessageQuery(params wsql.AckMessageQueryParams) (wsql.Query, error) {
	// The subscriber delivers Rows in order and stops at the first that is
	// not acked, so the acked rows are the prefix ending at LastRow.
	for i, row := range params.Rows {
		if row.Offset == params.LastRow.Offset {
			params.Rows = params.Rows[: i+1 : i+1]
			return a.OffsetsAdapter.AckMessageQuery(params)
		}
	}
	// Rolled back by the subscriber: nothing is acked, all is fetched again.
	return wsql.Query{}, fmt.Errorf("watermillsql: the last acked row (offset %d) is not among the fetched rows", params.LastRow.Offset)
}

// beginner begins the subscriber's transactions registered with dedup.
type beginner struct {
	db wsql.SQLBeginner
}

func (b beginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (wsql.Tx, error) {
	tx, err := b.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &batchedTx{Tx: tx, b: dedup.RegisterConsumingTx(tx)}, nil
}

func (b beginner) ExecContext(ctx context.Context, query string, args ...any) (wsql.Result, error) {
	return b.db.ExecContext(ctx, query, args...)
}

func (b beginner) QueryContext(ctx context.Context, query string, args ...any) (wsql.Rows, error) {
	return b.db.QueryContext(ctx, query, args...)
}

// errTxAborted refuses the subscriber's statements in a transaction the
// database ended: on MySQL they would autocommit, acking messages whose
// effects were rolled back.
var errTxAborted = fmt.Errorf("watermillsql: not acking: %w", dedup.ErrConsumingTxAborted)

// batchedTx is the subscriber's side of a registered transaction: its
// statements (the select, the ack) and its end wait for an attempt still
// running in it. Handlers reach the *sql.Tx through Tx.
type batchedTx struct {
	*sql.Tx
	b *dedup.ConsumingTx
}

// subscribers tells the subscriber's own statements from a handler's that
// reached this wrapper through wsql.TxFromContext: a message's context
// carries the transaction, the subscriber's statements' contexts do not.
// A handler's statement runs inside an attempt and must not wait for it.
func (t *batchedTx) subscribers(ctx context.Context) bool {
	tx, ok := wsql.TxFromContext(ctx)
	return !ok || tx != wsql.Tx(t)
}

func (t *batchedTx) ExecContext(ctx context.Context, query string, args ...any) (wsql.Result, error) {
	if t.subscribers(ctx) && !t.b.Wait() {
		return nil, errTxAborted
	}
	return t.Tx.ExecContext(ctx, query, args...)
}

func (t *batchedTx) QueryContext(ctx context.Context, query string, args ...any) (wsql.Rows, error) {
	if t.subscribers(ctx) && !t.b.Wait() {
		return nil, errTxAborted
	}
	return t.Tx.QueryContext(ctx, query, args...)
}

func (t *batchedTx) Commit() error {
	if !t.b.End() {
		_ = t.Tx.Rollback()
		return errTxAborted
	}
	return t.Tx.Commit()
}

func (t *batchedTx) Rollback() error {
	t.b.End()
	return t.Tx.Rollback()
}
