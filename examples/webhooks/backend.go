package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/watermillsql"
	"github.com/inboxmill/inboxmill/examples/internal/rerun"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/internal/dsn"
)

// backend is the queue between the receivers and the consumer, and the
// database holding the inbox and the business table.
type backend struct {
	describe   string
	db         *sql.DB
	store      *inbox.Store
	publisher  message.Publisher
	subscriber message.Subscriber
	poison     message.Publisher
	// joinTx joins the queue's consuming transaction, when it has one.
	joinTx dedup.TxJoiner
	// topics and the business table; unique per run on a shared server.
	stripeTopic, githubTopic, effects string
	// unacked counts the messages the queue holds that no consuming
	// transaction has committed yet; nil when the middleware's own
	// commit is the ack, as on GoChannel.
	unacked func(ctx context.Context) (int, error)
	close   func()
}

// sqliteBackend: Watermill's in-memory GoChannel and an SQLite file. No
// servers; the file is removed at the end unless path names one. With
// reset, the inbox and the business table an earlier run left in the file
// are dropped first, and out hears of it.
func sqliteBackend(ctx context.Context, path string, reset bool, out io.Writer) (*backend, error) {
	reset = reset && path != "" // a temporary file is new
	cleanup := func() {}
	if path == "" {
		dir, err := os.MkdirTemp("", "inboxmill-webhooks")
		if err != nil {
			return nil, err
		}
		path = filepath.Join(dir, "webhooks.db")
		cleanup = func() { _ = os.RemoveAll(dir) }
	}
	db, err := sql.Open("sqlite", sqlite.DSN(path))
	if err != nil {
		cleanup()
		return nil, err
	}
	b := &backend{describe: "GoChannel queue, SQLite inbox (" + path + ")", db: db,
		stripeTopic: "stripe.events", githubTopic: "github.events", effects: "webhook_effects"}
	// No Persistent: the router subscribes before the receivers publish.
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NopLogger{})
	b.publisher, b.subscriber, b.poison = pubSub, pubSub, pubSub
	b.close = func() {
		_ = pubSub.Close()
		_ = db.Close()
		cleanup()
	}
	if err := b.migrate(ctx, sqlite.Dialect(), "inbox", reset, out); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// postgresBackend: watermill-sql's PostgreSQL queue and the PostgreSQL
// inbox in the same database, so that the consumer's claim, its business
// write and the queue's ack commit in one transaction. Its tables carry a
// suffix unique to the run and are dropped at the end.
func postgresBackend(ctx context.Context, dataSource string) (*backend, error) {
	db, err := sql.Open("pgx", dataSource)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("PostgreSQL at %s: %w", dsn.Redact(dataSource), err)
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	suffix := hex.EncodeToString(r[:])
	b := &backend{describe: "watermill-sql queue and PostgreSQL inbox", db: db, joinTx: watermillsql.Tx,
		stripeTopic: "stripe_events_" + suffix, githubTopic: "github_events_" + suffix, effects: "webhook_effects_" + suffix}

	// Raw bodies in BYTEA (a webhook body need not be JSON); one message
	// per consuming transaction, since the queue acks all it fetched.
	schema := wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1, GeneratePayloadType: func(string) string { return "BYTEA" }}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	// watermillsql.NewSubscriber: its commit waits for a handler still
	// running when the subscriber gives up on a message.
	sub, err := watermillsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter:  schema,
		OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{},
		PollInterval:   10 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	poison := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	b.publisher, b.subscriber, b.poison = pub, sub, poison
	// The middleware joins the queue's transaction, so a delivery counted
	// as executed commits its business row only when the subscriber
	// commits its ack: a message is done once its row says acked.
	b.unacked = func(ctx context.Context) (int, error) {
		var n int
		err := db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM "watermill_`+b.stripeTopic+`" WHERE NOT acked)
			+ (SELECT COUNT(*) FROM "watermill_`+b.githubTopic+`" WHERE NOT acked)`).Scan(&n)
		return n, err
	}
	store := "webhook_inbox_" + suffix
	b.close = func() {
		_ = sub.Close()
		_ = poison.Close()
		drop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The inbox goes with every table its migrations made.
		if inboxStore, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: store}); err == nil {
			_ = inboxStore.MigrateDown(drop, 0)
		}
		for _, t := range []string{b.effects, "watermill_" + b.stripeTopic, "watermill_" + b.githubTopic} {
			_, _ = db.ExecContext(drop, `DROP TABLE IF EXISTS "`+t+`"`)
		}
		_ = db.Close()
	}
	// The queue tables exist before the first request: two receivers
	// creating them at once would race.
	for _, topic := range []string{b.stripeTopic, b.githubTopic} {
		if err := sub.SubscribeInitialize(topic); err != nil {
			b.close()
			return nil, err
		}
	}
	if err := b.migrate(ctx, postgres.Dialect(), store, false, nil); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// migrate creates the inbox and the business table, after dropping them
// with reset.
func (b *backend) migrate(ctx context.Context, dialect inbox.Dialect, table string, reset bool, out io.Writer) error {
	store, err := inbox.NewStore(b.db, dialect, inbox.Config{Table: table})
	if err != nil {
		return err
	}
	if reset {
		if err := rerun.Reset(ctx, out, store, b.effects); err != nil {
			return err
		}
	}
	// Here the example migrates its own inbox. In production migrations
	// run once per deploy (store.Migrate in a job, or your migration tool),
	// and a service checks at start-up that the schema is the one it was
	// built for, refusing to start on ErrSchemaOutdated or ErrSchemaNewer.
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if err := store.Validate(ctx); err != nil {
		return err
	}
	b.store = store
	_, err = b.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+b.effects+` (
		provider VARCHAR(32) NOT NULL, event_id VARCHAR(255) NOT NULL, event_type VARCHAR(64) NOT NULL)`)
	return err
}

func (b *backend) ph(n int) string { return b.store.Dialect().Placeholder(n) }
