package dedup_test

import (
	"errors"
	"io"
	"net/url"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/internal/testkit"
)

// A handler's own errors are not the database's: an io.EOF from decoding a
// payload or a *url.Error from an HTTP call must not come back labelled as
// a transient database error that IsRetryable would redeliver forever.
func TestHandlerErrorsAreNotMistakenForTransientDatabaseErrors(t *testing.T) {
	t.Parallel()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op"})
	require.NoError(t, err)
	for _, herr := range []error{io.EOF, io.ErrUnexpectedEOF, &url.Error{Op: "Get", URL: "htp://x", Err: errors.New("unsupported protocol scheme")}} {
		msg := message.NewMessage("u", []byte(`{}`))
		msg.Metadata.Set("event_id", "k")
		_, err := d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, herr })(msg)
		require.ErrorIs(t, err, herr)
		require.False(t, inbox.IsRetryable(err), "%v", herr)
		require.False(t, dedup.IsRetryable(err), "%v", herr)
	}
}
