package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

// embeddedReserve satisfies dedup.Mode through the promoted methods of the
// Reserve it embeds, but is not one of the package's modes.
type embeddedReserve struct{ dedup.Reserve }

// TestConfigModes checks how New takes Config.Mode: nil and the zero
// Transactional are the default mode, Reserve gets its defaults, either
// may be passed by pointer, and what is not a usable mode is refused
// before any message is.
func TestConfigModes(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	tests := []struct {
		name string
		mode dedup.Mode
		// reserve: the mode delivers in reserve mode; owner, when set, is
		// the lease owner it must use.
		reserve bool
		owner   string
		lease   time.Duration
		wantErr string
	}{
		{name: "nil is transactional", mode: nil},
		{name: "Transactional{}", mode: dedup.Transactional{}},
		{name: "*Transactional", mode: &dedup.Transactional{ReadFirst: dedup.ReadFirstAlways}},
		{name: "Reserve{} gets its defaults", mode: dedup.Reserve{}, reserve: true, lease: dedup.DefaultLease},
		{name: "*Reserve", mode: &dedup.Reserve{Owner: "worker-1", Lease: time.Minute}, reserve: true, owner: "worker-1", lease: time.Minute},
		{name: "Reserve with an owner", mode: dedup.Reserve{Owner: "w\u00e9-2"}, reserve: true, owner: "w\u00e9-2", lease: dedup.DefaultLease},
		{name: "nil *Transactional", mode: (*dedup.Transactional)(nil), wantErr: "Mode is a nil *dedup.Transactional"},
		{name: "nil *Reserve", mode: (*dedup.Reserve)(nil), wantErr: "Mode is a nil *dedup.Reserve"},
		{name: "a type embedding Reserve", mode: embeddedReserve{}, wantErr: "Mode must be dedup.Transactional or dedup.Reserve, not dedup_test.embeddedReserve"},
		{name: "Owner with a NUL byte", mode: dedup.Reserve{Owner: "a\x00b"}, wantErr: "Owner contains a NUL byte"},
		{name: "Owner not UTF-8", mode: &dedup.Reserve{Owner: "a\xffb"}, wantErr: "Owner is not valid UTF-8"},
		{name: "Transactional with negative ClaimAttempts", mode: &dedup.Transactional{ClaimAttempts: -1}, wantErr: "ClaimAttempts -1 is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, _ := testkit.SQLiteStore(t, inbox.Config{Now: func() time.Time { return now }})
			d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op", Mode: tt.mode})
			if tt.wantErr != "" {
				require.Nil(t, d)
				require.ErrorIs(t, err, dedup.ErrInvalidConfig)
				require.ErrorContains(t, err, tt.wantErr)
				require.Len(t, leafErrors(err), 1, "exactly one problem: %v", err)
				return
			}
			require.NoError(t, err)

			// What the handler sees tells the modes apart: a transaction and
			// no record yet (transactional), or no transaction and a record
			// reserved under a lease (reserve).
			var (
				hasTx  bool
				during *inbox.Record
				getErr error
			)
			id := inbox.ID{Operation: "op", Key: "k"}
			_, err = d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				_, hasTx = dedup.TxFromContext(msg.Context())
				during, getErr = store.Get(context.Background(), store.DB(), id)
				return nil, nil
			})(obsMsg("k", `{}`))
			require.NoError(t, err)
			rec, err := store.Get(context.Background(), store.DB(), id)
			require.NoError(t, err)
			require.Equal(t, inbox.StatusCompleted, rec.Status)
			if !tt.reserve {
				require.True(t, hasTx, "transactional: the handler runs in the claim's transaction")
				require.ErrorIs(t, getErr, inbox.ErrNotFound, "the claim is not visible before the commit")
				return
			}
			require.False(t, hasTx, "reserve: no transaction is open while the handler runs")
			require.NoError(t, getErr)
			require.Equal(t, inbox.StatusProcessing, during.Status)
			require.NotEmpty(t, during.LeaseOwner)
			if tt.owner != "" {
				require.Equal(t, tt.owner, during.LeaseOwner)
			}
			require.True(t, now.Add(tt.lease).Equal(during.LeaseUntil), "lease until %v, want now + %v", during.LeaseUntil, tt.lease)
			require.Empty(t, rec.LeaseOwner, "the lease ends with the outcome")
		})
	}
}

// A mode passed by pointer is copied by New: changing it afterwards changes
// nothing in the Deduplicator.
func TestConfigModeByPointerIsCopied(t *testing.T) {
	t.Parallel()
	store, _ := reserveStore(t)
	rs := &dedup.Reserve{Owner: "before", InFlightPoll: 5 * time.Millisecond}
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "charge", Mode: rs})
	require.NoError(t, err)
	rs.Owner = "after"
	require.Equal(t, "before", ownerOf(t, store, d, "k1"))
}

func TestReadFirstString(t *testing.T) {
	t.Parallel()
	for r, want := range map[dedup.ReadFirst]string{
		dedup.ReadFirstAuto: "auto", dedup.ReadFirstAlways: "always", dedup.ReadFirstNever: "never",
		dedup.ReadFirst(7): "ReadFirst(7)",
	} {
		require.Equal(t, want, r.String())
	}
}
