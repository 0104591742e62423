package failover_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/postgres"
)

// TestClassifyPgxClosedConnection: when a server dies without a goodbye (as
// backends do in an immediate shutdown), pgx notices the closed socket of an
// idle pooled connection and the next BEGIN on it fails with "conn closed"
// (pgconn.ErrConnClosed), which database/sql does not retry. Nothing was sent:
// the error is transient, and the failover test saw it on every kill.
func TestClassifyPgxClosedConnection(t *testing.T) {
	addr := dyingServer(t)
	db, err := sql.Open("pgx", fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", addr))
	require.NoError(t, err)
	defer db.Close()
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	conn, err := db.Conn(ctx) // connects: the server answers the handshake, then goes away
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	time.Sleep(200 * time.Millisecond) // the server has closed the socket

	_, berr := db.BeginTx(ctx, nil)
	require.ErrorIs(t, berr, pgconn.ErrConnClosed)
	require.True(t, inbox.IsRetryable(postgres.Dialect().Classify(berr)),
		"postgres.Dialect().Classify(%v) is not transient", berr)
	store, err := inbox.NewStore(db, postgres.Dialect(), inbox.Config{})
	require.NoError(t, err)
	require.True(t, inbox.IsRetryable(store.Classify(berr)), "store.Classify(%v) is not transient", berr)

	// A done context is not made transient: no retry changes it.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, cerr := db.BeginTx(cctx, nil)
	require.ErrorIs(t, cerr, context.Canceled)
	require.False(t, inbox.IsRetryable(postgres.Dialect().Classify(cerr)), "%v", cerr)
}

// dyingServer accepts connections, completes PostgreSQL's startup handshake
// and closes the connection 50 ms later without a message.
func dyingServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := pgproto3.NewBackend(c, c)
				if _, err := b.ReceiveStartupMessage(); err != nil {
					return
				}
				b.Send(&pgproto3.AuthenticationOk{})
				b.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "15.0"})
				b.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
				b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				if err := b.Flush(); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}()
		}
	}()
	return l.Addr().String()
}
