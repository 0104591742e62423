package driver

import (
	"context"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// A server out of connections refuses a setup statement for a while; the
// setup waits it out instead of failing the run. Any other error ends it
// at once.
func TestSetupWaitsOutTransientErrors(t *testing.T) {
	for _, tc := range []struct {
		kind string
		busy error
	}{
		{wire.Postgres, &pgconn.PgError{Code: "53300", Message: "sorry, too many clients already"}},
		{wire.MySQL, &mysql.MySQLError{Number: 1040, Message: "Too many connections"}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			d := &database{kind: tc.kind}
			calls := 0
			err := d.retryTransient(context.Background(), "migrate", func(context.Context) error {
				calls++
				if calls < 3 {
					return tc.busy
				}
				return nil
			})
			if err != nil || calls != 3 {
				t.Fatalf("err %v after %d calls; want nil after 3", err, calls)
			}

			bad := errors.New("syntax error")
			calls = 0
			err = d.retryTransient(context.Background(), "migrate", func(context.Context) error {
				calls++
				return bad
			})
			if !errors.Is(err, bad) || calls != 1 {
				t.Fatalf("err %v after %d calls; want the syntax error after 1", err, calls)
			}
		})
	}
}

// A canceled run stops waiting.
func TestSetupStopsWaitingWhenCanceled(t *testing.T) {
	d := &database{kind: wire.Postgres}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := d.retryTransient(ctx, "migrate", func(context.Context) error {
		calls++
		cancel()
		return &pgconn.PgError{Code: "53300"}
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("err %v after %d calls; want canceled after 1", err, calls)
	}
}
