package dedup_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"syscall"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// A handler's own errors are not the database's: an io.EOF from decoding a
// payload or a *url.Error from an HTTP call must not come back labelled as
// a transient database error that IsRetryable would redeliver forever.
func TestHandlerErrorsAreNotMistakenForTransientDatabaseErrors(t *testing.T) {
	t.Parallel()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op"})
	require.NoError(t, err)
	for _, herr := range []error{io.EOF, io.ErrUnexpectedEOF, &url.Error{Op: "Get", URL: "htp://x", Err: errors.New("unsupported protocol scheme")},
		// A refused HTTP call looks like a lost database connection; the
		// transaction still answering tells them apart.
		&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}} {
		msg := message.NewMessage("u", []byte(`{}`))
		msg.Metadata.Set("event_id", "k")
		_, err := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, herr })(msg)
		require.ErrorIs(t, err, herr)
		require.False(t, inbox.IsRetryable(err), "%v", herr)
		require.False(t, dedup.IsRetryable(err), "%v", herr)
	}
}

// When the claim's connection is lost while the handler runs (a failover,
// pg_terminate_backend, a restarted server), the handler's next statement
// fails. Every driver must report that as retryable — it is the
// database's failure, and the redelivery finds the truth — lib/pq
// included, which says driver.ErrBadConn where pgx and MySQL say more.
func TestLostConnectionInTheHandlerIsRetryable(t *testing.T) {
	for _, kind := range []testdb.Kind{testdb.PostgresPQ, testdb.PostgresPGX} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, kind)
			store := testkit.MigratedStore(t, db, testdb.Dialect(kind), inbox.Config{Table: testdb.UniqueName("inbox")})
			d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op",
				Mode: dedup.Transactional{ReadFirst: dedup.ReadFirstNever}})
			require.NoError(t, err)
			msg := message.NewMessage("u", []byte(`{}`))
			msg.Metadata.Set("event_id", "k-"+testdb.UniqueName("evt"))
			_, err = d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				tx, _ := dedup.TxFromContext(msg.Context())
				var pid int
				if err := tx.QueryRowContext(msg.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return nil, err
				}
				var ok bool
				if err := db.QueryRowContext(msg.Context(), "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
					return nil, fmt.Errorf("terminate backend %d: %v %v", pid, ok, err)
				}
				_, err := tx.ExecContext(msg.Context(), "SELECT 1")
				return nil, err
			})(msg)
			require.Error(t, err)
			require.True(t, dedup.IsRetryable(err), "a lost connection is retryable: %v", err)
			require.False(t, dedup.IsPoison(err))
		})
	}
}
