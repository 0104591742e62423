package dedup

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/sqlite"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// TestModeDefaults pins what New makes of each mode: the settings a
// Deduplicator then runs with.
func TestModeDefaults(t *testing.T) {
	t.Parallel()
	store, err := inbox.NewStore(testdb.Open(t, testdb.SQLite), sqlite.Dialect(), inbox.Config{})
	require.NoError(t, err)
	defaults := Reserve{Lease: DefaultLease, HeartbeatInterval: DefaultLease / 3, InFlightWait: DefaultInFlightWait,
		InFlightPoll: DefaultInFlightPoll}
	tests := []struct {
		name string
		mode Mode
		// Exactly one of tx and rs is set. An empty rs.Owner means the
		// generated default.
		tx *Transactional
		rs *Reserve
	}{
		{name: "nil", mode: nil, tx: &Transactional{ClaimAttempts: DefaultClaimAttempts}},
		{name: "Transactional{}", mode: Transactional{}, tx: &Transactional{ClaimAttempts: DefaultClaimAttempts}},
		{name: "*Transactional", mode: &Transactional{ClaimAttempts: 7, ReadFirst: ReadFirstNever},
			tx: &Transactional{ClaimAttempts: 7, ReadFirst: ReadFirstNever}},
		{name: "Reserve{}", mode: Reserve{}, rs: &defaults},
		{name: "*Reserve{}", mode: &Reserve{}, rs: &defaults},
		{name: "Lease sets the heartbeat", mode: Reserve{Lease: time.Minute},
			rs: &Reserve{Lease: time.Minute, HeartbeatInterval: 20 * time.Second, InFlightWait: DefaultInFlightWait, InFlightPoll: DefaultInFlightPoll}},
		{name: "a tiny Lease still beats", mode: Reserve{Lease: 2},
			rs: &Reserve{Lease: 2, HeartbeatInterval: 1, InFlightWait: DefaultInFlightWait, InFlightPoll: DefaultInFlightPoll}},
		{name: "-1 is kept", mode: Reserve{HeartbeatInterval: -1, InFlightWait: -1, Owner: "w"},
			rs: &Reserve{Lease: DefaultLease, HeartbeatInterval: -1, InFlightWait: -1, InFlightPoll: DefaultInFlightPoll, Owner: "w"}},
		{name: "everything set", mode: &Reserve{Lease: time.Second, HeartbeatInterval: time.Millisecond, InFlightWait: time.Hour,
			InFlightPoll: time.Minute, Owner: "w", AckPending: true},
			rs: &Reserve{Lease: time.Second, HeartbeatInterval: time.Millisecond, InFlightWait: time.Hour,
				InFlightPoll: time.Minute, Owner: "w", AckPending: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := New(store, Config{Key: KeyFromMetadata("event_id"), Mode: tt.mode})
			require.NoError(t, err)
			if tt.tx != nil {
				require.Nil(t, d.rs, "transactional mode")
				require.Equal(t, *tt.tx, d.tx)
				return
			}
			require.NotNil(t, d.rs, "reserve mode")
			got := *d.rs
			if tt.rs.Owner == "" {
				require.NotEmpty(t, got.Owner, "an owner is generated")
				require.NoError(t, inbox.CheckText(got.Owner, inbox.MaxOwnerLen))
				got.Owner = ""
			}
			require.Equal(t, *tt.rs, got)
		})
	}
}
