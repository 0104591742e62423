package failover_test

import (
	"database/sql"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
)

// TestHandlerStatementConnectionLossIsRetryable: the database connection of
// the middleware's own transaction is lost while the handler runs (its
// server was killed; here a proxy resets it). The middleware classifies a
// handler's error with Dialect().Classify only (driver codes, so that an
// HTTP call's network error is not taken for the database's), so unless
// the dialect recognises the driver's error the delivery fails with an
// error IsRetryable rejects, although nothing committed and a redelivery is
// exactly right. The failover test meets this when the kill lands inside a
// handler.
//
// Reset before the statement, both drivers return driver.ErrBadConn, which
// postgres.Dialect().Classify makes transient; so does pgx here when the
// reset comes during the statement. lib/pq then returns the bare
// *net.OpError of the socket read (in the failover test pgx returned that,
// or a bare io.ErrUnexpectedEOF, too), which nothing in the error tells
// apart from a handler's own network error: postgres/during-statement still
// fails. A fix belongs in the middleware (dedup/transactional.go, inTx,
// where the handler's error goes through Dialect().Classify): a handler
// error together with a lost connection on the middleware's own transaction
// (its Rollback failing with a transient connection error) is transient.
func TestHandlerStatementConnectionLossIsRetryable(t *testing.T) {
	p := startPair(t, true)
	for _, c := range []struct {
		drv      string
		inFlight bool
	}{{"pgx", false}, {"postgres", false}, {"pgx", true}, {"postgres", true}} {
		name := c.drv + "/before-statement"
		if c.inFlight {
			name = c.drv + "/during-statement"
		}
		drv := c.drv
		t.Run(name, func(t *testing.T) {
			px := newProxy(t, fmt.Sprintf("127.0.0.1:%d", p.ports[0]))
			host, port, _ := net.SplitHostPort(px.addr())
			db, err := sql.Open(drv, fmt.Sprintf("postgres://postgres@%s:%s/postgres?sslmode=disable", host, port))
			require.NoError(t, err)
			defer db.Close()
			store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{Table: fmt.Sprintf("inbox_%s_%t", drv, c.inFlight)})
			require.NoError(t, err)
			require.NoError(t, store.Migrate(t.Context()))
			d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op"})
			require.NoError(t, err)

			msg := message.NewMessage("u", []byte(`{}`))
			msg.Metadata.Set("event_id", "k")
			var herr error
			_, err = d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				tx, _ := dedup.TxFromContext(msg.Context())
				if !c.inFlight {
					px.reset()
					_, herr = tx.ExecContext(msg.Context(), `SELECT 1`)
					return nil, herr
				}
				go func() { time.Sleep(200 * time.Millisecond); px.reset() }()
				_, herr = tx.ExecContext(msg.Context(), `SELECT pg_sleep(2)`)
				return nil, herr
			})(msg)
			require.Error(t, herr)
			t.Logf("handler's statement: %v [%s]", herr, typeChain(herr))
			require.True(t, dedup.IsRetryable(err), "the delivery's error %v is not retryable", err)
		})
	}
}

// proxy forwards TCP connections to a server; reset cuts every one of them
// with a TCP reset, as a dying server's host does.
type proxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []*net.TCPConn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	px := &proxy{l: l}
	t.Cleanup(func() { _ = l.Close(); px.reset() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			px.mu.Lock()
			px.conns = append(px.conns, c.(*net.TCPConn), s.(*net.TCPConn))
			px.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
	return px
}

func (px *proxy) addr() string { return px.l.Addr().String() }

func (px *proxy) reset() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range px.conns {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
	px.conns = nil
}
