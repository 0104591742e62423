package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/watermillsql"
	"github.com/inboxmill/inboxmill/handlers/webhook"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestEndToEnd: one Stripe event delivered five times — twice in a
// row, then three retries at once, each signed anew as Stripe does —
// through the receiver, a watermill-sql queue on PostgreSQL, a router and
// the dedup middleware in transactional mode, joined to the consuming
// transaction. All five are enqueued; the business handler's write commits
// once.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testdb.Open(t, testdb.PostgresPGX)
	topic := testdb.UniqueName("webhooks")
	effects := testdb.UniqueName("payments")
	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: testdb.UniqueName("inbox")})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, tbl := range append([]string{effects, "watermill_" + topic}, inbox.TableNames(store.Table())...) {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + tbl)
		}
	})
	require.NoError(t, store.Migrate(ctx))
	_, err = db.ExecContext(ctx, "CREATE TABLE "+effects+" (event_id TEXT NOT NULL, tenant_id TEXT NOT NULL, amount INTEGER NOT NULL)")
	require.NoError(t, err)

	// The queue: raw bodies in BYTEA (a webhook body need not be JSON), one
	// message per consuming transaction.
	schema := wsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1, GeneratePayloadType: func(string) string { return "BYTEA" }}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
	require.NoError(t, err)
	sub, err := watermillsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter:  schema,
		OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{},
		PollInterval:   10 * time.Millisecond,
		ResendInterval: 10 * time.Millisecond,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	// Created up front: concurrent first publishes would race to create it.
	require.NoError(t, sub.SubscribeInitialize(topic))

	d, err := dedup.New(store, dedup.Config{
		Key:          dedup.KeyFromMetadata(webhook.MetadataEventID),
		Scope:        dedup.ScopeFromMetadata(webhook.MetadataTenantID),
		IgnoreFields: []string{"pending_webhooks"},                 // Stripe may count down between attempts
		Mode:         dedup.Transactional{JoinTx: watermillsql.Tx}, // claim, write and ack commit together
	})
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(d.Middleware)
	var (
		mu   sync.Mutex
		runs int
		seen []message.Metadata
	)
	router.AddConsumerHandler("record_payment", topic, sub, func(msg *message.Message) error {
		tx, ok := dedup.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no transaction")
		}
		mu.Lock()
		runs++
		seen = append(seen, msg.Metadata)
		mu.Unlock()
		_, err := tx.ExecContext(msg.Context(), "INSERT INTO "+effects+" (event_id, tenant_id, amount) VALUES ($1, $2, $3)",
			msg.Metadata.Get(webhook.MetadataEventID), msg.Metadata.Get(webhook.MetadataTenantID), 2000)
		return err
	})
	routerDone := make(chan struct{})
	go func() {
		defer close(routerDone)
		_ = router.Run(ctx)
	}()
	t.Cleanup(func() {
		_ = router.Close()
		<-routerDone
		_ = sub.Close()
	})
	select {
	case <-router.Running():
	case <-ctx.Done():
		t.Fatal("router did not start")
	}

	receiver, err := webhook.NewReceiver(pub, webhook.ReceiverConfig{
		Topic:    topic,
		Verifier: webhook.StripeVerifier("whsec_old", "whsec_new"),
		Tenant:   "acme",
	})
	require.NoError(t, err)
	srv := httptest.NewServer(receiver)
	defer srv.Close()

	const secret = "whsec_new"
	deliver := func(attempt int) int {
		body := fmt.Sprintf(`{"id":"evt_3OqLmP2eZvKYlo2C","object":"event","type":"payment_intent.succeeded",`+
			`"pending_webhooks":%d,"data":{"object":{"id":"pi_1","amount":2000}}}`, 5-attempt)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Stripe-Signature", stripeSign(secret, time.Now().Add(-time.Duration(attempt)*time.Second), body))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Errorf("attempt %d: %v", attempt, err)
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, deliver(0))
	require.Equal(t, http.StatusOK, deliver(1))
	var wg sync.WaitGroup
	for attempt := 2; attempt < 5; attempt++ {
		wg.Go(func() {
			if code := deliver(attempt); code != http.StatusOK {
				t.Errorf("attempt %d: status %d", attempt, code)
			}
		})
	}
	wg.Wait()

	var queued int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM "watermill_`+topic+`"`).Scan(&queued))
	require.Equal(t, 5, queued, "every delivery is enqueued; deduplication happens downstream")

	require.Eventually(t, func() bool {
		st := d.Stats()
		return st.Executed+st.Duplicates >= 5
	}, time.Minute, 10*time.Millisecond)

	st := d.Stats()
	require.EqualValues(t, 1, st.Executed)
	require.EqualValues(t, 4, st.Duplicates)
	var rows int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+effects).Scan(&rows))
	require.Equal(t, 1, rows, "one business effect for five deliveries")
	mu.Lock()
	require.Equal(t, 1, runs)
	md := seen[0]
	mu.Unlock()
	require.Equal(t, "evt_3OqLmP2eZvKYlo2C", md.Get(webhook.MetadataEventID))
	require.Equal(t, "acme", md.Get(webhook.MetadataTenantID))
	require.Equal(t, "stripe", md.Get(webhook.MetadataProvider))
	require.Equal(t, "payment_intent.succeeded", md.Get(webhook.MetadataEventType))
	_, err = time.Parse(time.RFC3339Nano, md.Get(webhook.MetadataReceivedAt))
	require.NoError(t, err)

	// Every queued message was acknowledged.
	require.Eventually(t, func() bool {
		var pending int
		return db.QueryRowContext(ctx, `SELECT COUNT(*) FROM "watermill_`+topic+`" WHERE NOT acked`).Scan(&pending) == nil && pending == 0
	}, 10*time.Second, 10*time.Millisecond)
}
