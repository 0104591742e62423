// Package watermillsql joins the consuming transaction of watermill-sql's
// subscriber (github.com/ThreeDotsLabs/watermill-sql/v4), so that the ack,
// the inbox record and the handler's writes commit together:
//
//	d, err := dedup.New(store, dedup.Config{
//		Key:  dedup.KeyFromMetadata("event_id"),
//		Mode: dedup.Transactional{JoinTx: watermillsql.Tx},
//	})
//
// It is the only inboxmill package that imports watermill-sql (and through
// it the PostgreSQL and MySQL drivers); a program that does not join SQL
// queue transactions does not link them.
//
// The subscriber must be built on database/sql, with the inbox in the same
// database, and with [NewSubscriber] (the arguments of wsql.NewSubscriber):
// the middleware joins only transactions registered with
// [dedup.RegisterConsumingTx] and refuses others with
// [dedup.ErrUnregisteredConsumingTx]. watermill-sql's own subscriber
// commits the consuming transaction when it stops waiting for a message
// (it is closing, or the ack deadline passed) while the handler may still
// run in it; a commit between the inbox record and the handler's write
// keeps the record without the effect, and the redelivery is acked as a
// duplicate. NewSubscriber's commit waits for the attempt.
//
// # Batches
//
// watermill-sql's subscriber (v4.1.3) fetches up to the schema adapter's
// SubscribeBatchSize rows in one transaction, hands their messages to the
// handler one at a time, resending a nacked one in the same transaction,
// and stops at the first it gives up on (it is closing, or the message's
// AckDeadline passed). It then runs the offsets adapter's ack statement
// and commits. The queue adapters (PostgreSQLQueueOffsetsAdapter,
// MySQLQueueOffsetsAdapter) ack every fetched row, so the rows after the
// one given up on, never delivered, are acked and lost. The offset
// adapters (DefaultPostgreSQLOffsetsAdapter, DefaultMySQLOffsetsAdapter)
// store the last acked row's offset and are safe in this respect.
//
// [NewSubscriber] consumes batches safely:
//
//	sub, err := watermillsql.NewSubscriber(db, wsql.SubscriberConfig{
//		SchemaAdapter:  wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 32},
//		OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{},
//		AckDeadline:    &ackDeadline, // well above a handler's longest run
//	}, logger)
//
// It acks only the messages delivered and acked ([AckDelivered]), and
// registers each transaction with [dedup.RegisterConsumingTx], so that:
//
//   - every message runs under a savepoint; a failed or panicking attempt
//     is rolled back to it, and the messages handled before it in the
//     batch stay committed with the ack, once;
//   - a message the subscriber gives up on is not acked and comes back in a
//     later transaction, as do the undelivered rows after it; a message
//     that fails for good (dedup.Permanent) is recorded as failed in the
//     transaction and acked with it when a poison queue takes it;
//   - the ack and the commit wait for an attempt still running, so they
//     never commit half of it; an attempt that began after the subscriber
//     gave up writes nothing (dedup.ErrConsumingTxEnded);
//   - a transaction an attempt found ended by the database (a MySQL
//     deadlock) is rolled back instead of acked, since on MySQL the ack
//     would run outside it and autocommit.
//
// A handler statement in flight when the subscriber gives up is cancelled
// with its context, which costs the connection on both drivers and so the
// whole batch: it is rolled back and delivered again, safely but as
// wasted work. Closing a message.Router also cancels the context the
// transaction was begun with, which database/sql answers with a rollback.
// Handlers should reach the transaction through [dedup.TxFromContext] or
// [Tx].
package watermillsql

import (
	"context"
	"database/sql"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/inboxmill/inboxmill/dedup"
)

// Tx is a [dedup.TxJoiner]: it returns the *sql.Tx watermill-sql's
// subscriber consumed the message in, if any.
func Tx(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := wsql.TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	switch t := tx.(type) {
	case *wsql.StdSQLTx:
		return t.Tx, t.Tx != nil
	case wsql.StdSQLTx:
		return t.Tx, t.Tx != nil
	case *batchedTx:
		return t.Tx, t.Tx != nil
	}
	return nil, false
}

var _ dedup.TxJoiner = Tx
