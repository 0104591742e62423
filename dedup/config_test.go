package dedup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testdb"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// unmigratedStore returns a store that has never touched its database.
func unmigratedStore(t *testing.T) *inbox.Store {
	t.Helper()
	store, err := inbox.NewStore(testdb.Open(t, testdb.SQLite), sqlite.Dialect(), inbox.Config{})
	require.NoError(t, err)
	return store
}

// leafErrors flattens a tree of errors.Join'ed errors into its leaves: the
// problems New reports. An error wrapping several with fmt.Errorf (one
// problem, a sentinel and its cause) is one leaf.
func leafErrors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok && fmt.Sprintf("%T", err) == "*errors.joinError" {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leafErrors(e)...)
		}
		return out
	}
	return []error{err}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	store := unmigratedStore(t)
	valid := func() dedup.Config {
		return dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op"}
	}
	tests := []struct {
		name   string
		store  *inbox.Store
		mutate func(*dedup.Config)
		want   string
	}{
		{name: "nil store", mutate: func(*dedup.Config) {}, want: "store is nil"},
		{name: "missing Key", store: store, mutate: func(c *dedup.Config) { c.Key = nil }, want: "Key is required"},
		{name: "Fingerprint and IgnoreFields", store: store, mutate: func(c *dedup.Config) {
			c.Fingerprint = dedup.RawFingerprint
			c.IgnoreFields = []string{"sent_at"}
		}, want: "IgnoreFields only applies to the default Fingerprint"},
		{name: "Fingerprint and an invalid IgnoreFields path", store: store, mutate: func(c *dedup.Config) {
			c.Fingerprint = dedup.RawFingerprint
			c.IgnoreFields = []string{"a..b"}
		}, want: "IgnoreFields only applies to the default Fingerprint"},
		{name: "Retention -2ns", store: store, mutate: func(c *dedup.Config) { c.Retention = -2 }, want: "Retention"},
		{name: "Retention -1h", store: store, mutate: func(c *dedup.Config) { c.Retention = -time.Hour }, want: "Retention -1h0m0s is negative"},
		{name: "negative ClaimAttempts", store: store, mutate: func(c *dedup.Config) { c.Mode = dedup.Transactional{ClaimAttempts: -1} }, want: "ClaimAttempts -1 is negative"},
		{name: "negative Group.MaxSize", store: store, mutate: func(c *dedup.Config) { c.Mode = dedup.Transactional{Group: &dedup.Group{MaxSize: -1}} }, want: "Group.MaxSize -1"},
		{name: "Group.MaxSize above MaxClaimMany", store: store, mutate: func(c *dedup.Config) {
			c.Mode = dedup.Transactional{Group: &dedup.Group{MaxSize: inbox.MaxClaimMany + 1}}
		}, want: "Group.MaxSize 1001"},
		{name: "Group.MaxLinger -2ns", store: store, mutate: func(c *dedup.Config) { c.Mode = dedup.Transactional{Group: &dedup.Group{MaxLinger: -2}} }, want: "Group.MaxLinger"},
		{name: "negative Group.Coordinators", store: store, mutate: func(c *dedup.Config) { c.Mode = dedup.Transactional{Group: &dedup.Group{Coordinators: -1}} }, want: "Group.Coordinators -1"},
		{name: "Batch.MaxSize above MaxClaimMany", store: store, mutate: func(c *dedup.Config) {
			c.Mode = dedup.Reserve{Batch: &dedup.Batch{MaxSize: inbox.MaxClaimMany + 1}}
		}, want: "Batch.MaxSize 1001"},
		{name: "Batch.MaxLinger -2ns", store: store, mutate: func(c *dedup.Config) { c.Mode = dedup.Reserve{Batch: &dedup.Batch{MaxLinger: -2}} }, want: "Batch.MaxLinger"},
		{name: "negative Batch.Statements", store: store, mutate: func(c *dedup.Config) { c.Mode = dedup.Reserve{Batch: &dedup.Batch{Statements: -1}} }, want: "Batch.Statements -1"},
		{name: "unknown ReadFirst", store: store, mutate: func(c *dedup.Config) { c.Mode = dedup.Transactional{ReadFirst: dedup.ReadFirst(7)} }, want: "unknown ReadFirst 7"},
		{name: "Operation of 256 bytes", store: store, mutate: func(c *dedup.Config) { c.Operation = strings.Repeat("o", 256) }, want: "operation is 256 bytes, more than 255"},
		{name: "ignore path a..b", store: store, mutate: func(c *dedup.Config) { c.IgnoreFields = []string{"a..b"} }, want: `ignore path "a..b"`},
		{name: "empty ignore path", store: store, mutate: func(c *dedup.Config) { c.IgnoreFields = []string{"ok", ""} }, want: `ignore path ""`},
		{name: "ignore path with a trailing dot", store: store, mutate: func(c *dedup.Config) { c.IgnoreFields = []string{"meta."} }, want: `ignore path "meta."`},
		{name: "ignore path with a leading dot", store: store, mutate: func(c *dedup.Config) { c.IgnoreFields = []string{".meta"} }, want: `ignore path ".meta"`},
		{name: "RepeatLogInterval -2ns", store: store, mutate: func(c *dedup.Config) { c.RepeatLogInterval = -2 }, want: "RepeatLogInterval -2ns is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid()
			tt.mutate(&cfg)
			d, err := dedup.New(tt.store, cfg)
			require.ErrorIs(t, err, dedup.ErrInvalidConfig)
			require.Contains(t, err.Error(), tt.want)
			require.Nil(t, d)
			require.Len(t, leafErrors(err), 1, "exactly one problem: %v", err)
			require.False(t, dedup.IsPoison(err))
			require.False(t, dedup.IsRetryable(err))
		})
	}
}

func TestNewReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  dedup.Config
		want []string
	}{
		{
			name: "with the default fingerprint",
			cfg: dedup.Config{
				Retention:    -2 * time.Second,
				Mode:         dedup.Transactional{ClaimAttempts: -5},
				Operation:    strings.Repeat("x", 300),
				IgnoreFields: []string{"a..b"},
			},
			want: []string{"store is nil", "Key is required", "Retention -2s", "ClaimAttempts -5", "operation is 300 bytes", `ignore path "a..b"`},
		},
		{
			name: "with a custom fingerprint",
			cfg: dedup.Config{
				Fingerprint:  dedup.RawFingerprint,
				IgnoreFields: []string{"sent_at"},
				Retention:    -3,
				Mode:         &dedup.Transactional{ClaimAttempts: -1},
			},
			want: []string{"store is nil", "Key is required", "IgnoreFields only applies", "Retention", "ClaimAttempts -1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := dedup.New(nil, tt.cfg)
			require.Nil(t, d)
			require.ErrorIs(t, err, dedup.ErrInvalidConfig)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
			leaves := leafErrors(err)
			require.Len(t, leaves, len(tt.want), "one error per problem: %v", err)
			for _, leaf := range leaves {
				require.ErrorIs(t, leaf, dedup.ErrInvalidConfig, "every problem wraps ErrInvalidConfig: %v", leaf)
			}
		})
	}
}

func TestNewAcceptsValidConfigs(t *testing.T) {
	t.Parallel()
	store := unmigratedStore(t)
	tests := []struct {
		name string
		cfg  dedup.Config
	}{
		{name: "only Key", cfg: dedup.Config{Key: dedup.KeyFromMetadata("event_id")}},
		{name: "Retention -1 keeps forever", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), Retention: -1}},
		{name: "Retention 1ns", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), Retention: 1}},
		{name: "RepeatLogInterval -1 logs every repeat", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), RepeatLogInterval: -1}},
		{name: "a TracerProvider of its own", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), TracerProvider: noop.NewTracerProvider()}},
		{name: "group commit with defaults", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), Mode: dedup.Transactional{Group: &dedup.Group{}}}},
		{name: "reserve batches with defaults", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), Mode: dedup.Reserve{Batch: &dedup.Batch{}}}},
		{name: "group commit without linger", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"),
			Mode: dedup.Transactional{Group: &dedup.Group{MaxSize: 1, MaxLinger: -1, Coordinators: 1}}}},
		{name: "ClaimAttempts 1", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), Mode: dedup.Transactional{ClaimAttempts: 1}}},
		{name: "Operation of 255 bytes", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), Operation: strings.Repeat("o", 255)}},
		{name: "valid IgnoreFields", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), IgnoreFields: []string{"sent_at", "meta.trace_id", "a.b.c.d"}}},
		{name: "custom Fingerprint", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), Fingerprint: dedup.RawFingerprint}},
		{name: "custom Fingerprint and empty IgnoreFields", cfg: dedup.Config{Key: dedup.KeyFromMetadata("id"), Fingerprint: dedup.RawFingerprint, IgnoreFields: []string{}}},
		{name: "everything set", cfg: dedup.Config{
			Key: dedup.KeyFromJSON("id"), Scope: dedup.ScopeFromMetadata("tenant"), Operation: "op",
			IgnoreFields: []string{"sent_at"}, Retention: time.Hour,
			Mode: dedup.Transactional{TxOptions: &sql.TxOptions{}, ClaimAttempts: 10, ReadFirst: dedup.ReadFirstNever,
				JoinTx: func(context.Context) (*sql.Tx, bool) { return nil, false }},
			Logger: watermill.NopLogger{}, RepeatLogInterval: time.Second, Registerer: prometheus.NewRegistry(),
			TracerProvider: noop.NewTracerProvider(),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := dedup.New(store, tt.cfg)
			require.NoError(t, err)
			require.NotNil(t, d)
			require.Equal(t, dedup.Stats{}, d.Stats())
		})
	}
}

func TestNewDoesNotTouchTheDatabase(t *testing.T) {
	t.Parallel()
	db := testdb.Open(t, testdb.SQLite)
	store, err := inbox.NewStore(db, sqlite.Dialect(), inbox.Config{})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id")})
	require.NoError(t, err, "New works on a closed, unmigrated database")
	require.NotNil(t, d)
}

func TestNewDoesNotMutateTheCallersConfig(t *testing.T) {
	t.Parallel()
	store := unmigratedStore(t)
	ignore := []string{"sent_at", "meta.trace_id"}
	cfg := dedup.Config{Key: dedup.KeyFromMetadata("event_id"), IgnoreFields: ignore}
	d, err := dedup.New(store, cfg)
	require.NoError(t, err)
	require.NotNil(t, d)

	require.NotNil(t, cfg.Key)
	require.Nil(t, cfg.Scope, "Scope default not written back")
	require.Empty(t, cfg.Operation)
	require.Nil(t, cfg.Fingerprint, "Fingerprint default not written back")
	require.Equal(t, []string{"sent_at", "meta.trace_id"}, cfg.IgnoreFields)
	require.Equal(t, []string{"sent_at", "meta.trace_id"}, ignore, "the IgnoreFields backing array is untouched")
	require.Zero(t, cfg.Retention, "Retention default not written back")
	require.Nil(t, cfg.Mode, "Mode default not written back")
	require.Nil(t, cfg.Logger, "Logger default not written back")
	require.Zero(t, cfg.RepeatLogInterval, "RepeatLogInterval default not written back")
	require.Nil(t, cfg.TracerProvider, "TracerProvider default not written back")
	require.Nil(t, cfg.Registerer)

	// The same Config value can build a second Deduplicator.
	d2, err := dedup.New(store, cfg)
	require.NoError(t, err)
	require.NotSame(t, d, d2)

	// Nor on failure.
	bad := dedup.Config{Retention: -5, IgnoreFields: []string{"x..y"}}
	_, err = dedup.New(store, bad)
	require.Error(t, err)
	require.Nil(t, bad.Key)
	require.Nil(t, bad.Scope)
	require.Nil(t, bad.Logger)
	require.Equal(t, time.Duration(-5), bad.Retention)
	require.Nil(t, bad.Mode)

	// Nor into a mode passed by pointer.
	rs := &dedup.Reserve{}
	tx := &dedup.Transactional{}
	for _, mode := range []dedup.Mode{rs, tx} {
		_, err = dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Mode: mode})
		require.NoError(t, err)
	}
	require.Equal(t, dedup.Reserve{}, *rs, "Reserve defaults not written back")
	require.Equal(t, dedup.Transactional{}, *tx, "Transactional defaults not written back")
	g := &dedup.Group{}
	_, err = dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Mode: dedup.Transactional{Group: g}})
	require.NoError(t, err)
	require.Equal(t, dedup.Group{}, *g, "Group defaults not written back")
	require.Equal(t, []string{"x..y"}, bad.IgnoreFields)
}

func TestRetentionSetsTheRecordsExpiry(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 4, 5, 6, 7, 123456000, time.UTC)
	tests := []struct {
		name      string
		retention time.Duration
		want      time.Time
	}{
		{name: "default", retention: 0, want: now.Add(dedup.DefaultRetention)},
		{name: "forever", retention: -1, want: time.Time{}},
		{name: "custom", retention: 90 * time.Minute, want: now.Add(90 * time.Minute)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, _ := testkit.SQLiteStore(t, inbox.Config{Now: func() time.Time { return now }})
			d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op", Retention: tt.retention})
			require.NoError(t, err)
			msg := message.NewMessage("u", []byte(`{}`))
			msg.Metadata.Set("event_id", "k")
			_, err = d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
			require.NoError(t, err)
			rec, err := store.Get(context.Background(), store.DB(), inbox.ID{Operation: "op", Key: "k"})
			require.NoError(t, err)
			require.Equal(t, inbox.StatusCompleted, rec.Status)
			require.True(t, tt.want.Equal(rec.ExpiresAt), "expires_at %v, want %v", rec.ExpiresAt, tt.want)
			require.True(t, now.Equal(rec.CreatedAt), "created_at %v, want %v", rec.CreatedAt, now)
		})
	}
	require.Equal(t, 7*24*time.Hour, dedup.DefaultRetention)
}

func TestIdentityFromConfig(t *testing.T) {
	t.Parallel()
	fpErr := errors.New("fingerprint backend down")
	tests := []struct {
		name    string
		cfg     dedup.Config
		meta    []string
		wantErr error
		wantMsg string
		// wantScope/wantOp locate the record of a successful delivery.
		wantScope, wantOp string
	}{
		{
			name:    "no Operation outside a router",
			cfg:     dedup.Config{Key: dedup.KeyFromMetadata("event_id")},
			meta:    []string{"event_id", "k"},
			wantErr: dedup.ErrInvalidKey,
			wantMsg: "Config.Operation",
		},
		{
			name:      "Operation of 255 bytes",
			cfg:       dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: strings.Repeat("o", 255)},
			meta:      []string{"event_id", "k"},
			wantScope: "", wantOp: strings.Repeat("o", 255),
		},
		{
			name:      "scope from metadata",
			cfg:       dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Scope: dedup.ScopeFromMetadata("tenant"), Operation: "op"},
			meta:      []string{"event_id", "k", "tenant", "acme"},
			wantScope: "acme", wantOp: "op",
		},
		{
			name:      "constant scope",
			cfg:       dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Scope: dedup.ScopeConstant("global"), Operation: "op"},
			meta:      []string{"event_id", "k"},
			wantScope: "global", wantOp: "op",
		},
		{
			name:    "missing scope",
			cfg:     dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Scope: dedup.ScopeFromMetadata("tenant"), Operation: "op"},
			meta:    []string{"event_id", "k"},
			wantErr: dedup.ErrMissingKey,
		},
		{
			name:    "constant scope too long",
			cfg:     dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Scope: dedup.ScopeConstant(strings.Repeat("s", 256)), Operation: "op"},
			meta:    []string{"event_id", "k"},
			wantErr: dedup.ErrInvalidKey,
		},
		{
			name:    "key with a NUL byte",
			cfg:     dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op"},
			meta:    []string{"event_id", "a\x00b"},
			wantErr: dedup.ErrInvalidKey,
		},
		{
			name:    "key error is reported before the scope error",
			cfg:     dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Scope: dedup.ScopeFromMetadata("tenant"), Operation: "op"},
			wantErr: dedup.ErrMissingKey,
			wantMsg: "key from metadata",
		},
		{
			name: "fingerprint error",
			cfg: dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op",
				Fingerprint: func(*message.Message) ([]byte, error) { return nil, fpErr }},
			meta:    []string{"event_id", "k"},
			wantErr: fpErr,
			wantMsg: "dedup: cannot fingerprint the payload",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, _ := testkit.SQLiteStore(t, inbox.Config{})
			d, err := dedup.New(store, tt.cfg)
			require.NoError(t, err)
			msg := keyMsg(`{"n":1}`, tt.meta...)
			calls := 0
			_, err = d.Middleware(func(*message.Message) ([]*message.Message, error) {
				calls++
				return nil, nil
			})(msg)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				if tt.wantMsg != "" {
					require.Contains(t, err.Error(), tt.wantMsg)
				}
				require.Zero(t, calls, "the handler does not run")
				require.Equal(t, dedup.Stats{Invalid: 1}, d.Stats())
				var n int
				require.NoError(t, store.DB().QueryRow("SELECT COUNT(*) FROM inbox").Scan(&n))
				require.Zero(t, n, "nothing is recorded")
				return
			}
			require.NoError(t, err)
			require.Equal(t, 1, calls)
			require.Equal(t, dedup.Stats{Executed: 1}, d.Stats())
			_, err = store.Get(context.Background(), store.DB(), inbox.ID{Scope: tt.wantScope, Operation: tt.wantOp, Key: "k"})
			require.NoError(t, err)
		})
	}
}

// An Operation that no record can carry is a configuration error, not a
// stream of poisoned messages.
func TestNewRejectsUnusableOperation(t *testing.T) {
	t.Parallel()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	for _, op := range []string{"a\x00b", "a\xffb"} {
		_, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: op})
		require.ErrorIs(t, err, dedup.ErrInvalidConfig, "%q", op)
	}
}
