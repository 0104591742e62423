package reconcile_test

import (
	"context"
	"log"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/handlers/reconcile"
	"github.com/inboxmill/inboxmill/inbox"
)

// capture is a slog.Handler keeping the records at or above Info.
type capture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (c *capture) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (c *capture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r.Clone())
	return nil
}
func (c *capture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *capture) WithGroup(string) slog.Handler      { return c }

// TestReconcilerLogsToSlogDefault: with no Logger, verdicts reach
// slog.Default() as it is when New runs. Not parallel: it swaps the
// process's default logger.
func TestReconcilerLogsToSlogDefault(t *testing.T) {
	prev, w, flags := slog.Default(), log.Writer(), log.Flags()
	t.Cleanup(func() {
		slog.SetDefault(prev)
		log.SetOutput(w)
		log.SetFlags(flags)
	})
	c := &capture{}
	slog.SetDefault(slog.New(c))

	e := newEnv(t, "inbox")
	e.pending("pay-1", "ch_1")
	r := e.reconciler(reconcile.Config{Resolve: resolveAll(reconcile.Succeeded)})
	_, err := r.RunOnce(e.ctx)
	require.NoError(t, err)

	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, c.recs, 1)
	require.Equal(t, "inboxmill: intent reconciled", c.recs[0].Message)
	attrs := map[string]string{}
	c.recs[0].Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	require.Equal(t, inbox.ID{Operation: "charge", Key: "pay-1"}.Digest(), attrs["key_digest"])
	require.Equal(t, "succeeded", attrs["verdict"])
}
