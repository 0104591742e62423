package watermillsql_test

import (
	"context"
	"database/sql"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/watermillsql"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
)

// The middleware joins the transaction watermill-sql's subscriber consumed
// the message in: the queue's ack, the inbox record and the handler's
// writes commit together, or not at all. It needs PostgreSQL (or MySQL),
// so it is not run here; examples/sql-queue is the runnable program.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{}) // the inbox in the queue's database
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	logger := watermill.NewSlogLogger(nil)
	ackDeadline := 10 * time.Second // well above a handler's longest run
	// watermillsql.NewSubscriber, not wsql.NewSubscriber: the middleware
	// joins only the transactions it registers.
	sub, err := watermillsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter:    wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1}, // or more
		AckDeadline:      &ackDeadline,
		OffsetsAdapter:   wsql.PostgreSQLQueueOffsetsAdapter{},
		InitializeSchema: true,
	}, logger)
	if err != nil {
		panic(err)
	}
	d, err := dedup.New(store, dedup.Config{
		Key:  dedup.KeyFromMetadata("event_id"),
		Mode: dedup.Transactional{JoinTx: watermillsql.Tx},
	})
	if err != nil {
		panic(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(d.Middleware)
	router.AddConsumerHandler("book_invoice", "invoices", sub, func(msg *message.Message) error {
		// The consuming transaction, under a savepoint for this attempt.
		tx, _ := dedup.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (event_id) VALUES ($1)`,
			msg.Metadata.Get("event_id"))
		return err
	})
	_ = router.Run(ctx)
}

// NewSubscriber builds the subscriber for batches: it acks only the
// messages delivered and acked, and the middleware accepts several
// messages in one of its transactions.
func ExampleNewSubscriber() {
	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ackDeadline := 10 * time.Second // well above a handler's longest run
	sub, err := watermillsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter:    wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 32},
		OffsetsAdapter:   wsql.PostgreSQLQueueOffsetsAdapter{},
		AckDeadline:      &ackDeadline,
		InitializeSchema: true,
	}, watermill.NewSlogLogger(nil))
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	// ... the router and dedup.Transactional{JoinTx: watermillsql.Tx} as in
	// the package example.
}
