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
// The subscriber must be built on database/sql (sql.BeginnerFromStdSQL),
// with the inbox in the same database, and its schema adapter must fetch
// one message per transaction (SubscribeBatchSize: 1): the adapter acks
// the whole fetched batch, so with more a failed message would be acked
// along with the rest. The middleware refuses a second message in one
// transaction with [dedup.ErrBatchedConsumingTx].
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
	}
	return nil, false
}

var _ dedup.TxJoiner = Tx
