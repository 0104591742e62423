package pgxgroup_test

import (
	"context"
	"database/sql"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/pgxgroup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
)

// Group commit in pgx pipelines: the handler queues its writes, which go
// to PostgreSQL with the group's COMMIT. It needs PostgreSQL, so it is
// not run here; the package's tests run it against a server.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	d, err := dedup.New(store, dedup.Config{
		Key:       dedup.KeyFromMetadata("event_id"),
		Operation: "book_order",
		Mode:      dedup.Transactional{Group: &dedup.Group{Pipeline: pgxgroup.Pipeline()}},
	})
	if err != nil {
		panic(err)
	}
	errNoStock := errors.New("out of stock")
	handler := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := pgxgroup.FromContext(msg.Context())
		if !ok {
			return nil, errors.New("not in a pipelined group")
		}
		id := msg.Metadata.Get("event_id")
		tx.Queue(`INSERT INTO orders (id, body) VALUES ($1, $2)`, id, msg.Payload)
		// Checked when its result arrives, before the group commits: an
		// error fails this delivery alone.
		tx.Queue(`UPDATE stock SET left = left - 1 WHERE sku = $1 AND left > 0`, msg.Metadata.Get("sku")).
			Exec(func(ct pgconn.CommandTag) error {
				if ct.RowsAffected() != 1 {
					return dedup.Permanent(errNoStock)
				}
				return nil
			})
		return nil, nil
	})
	_ = handler // router.AddConsumerHandler(..., handler) or router.AddMiddleware(d.Middleware)
}
