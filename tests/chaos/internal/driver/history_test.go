package driver

import (
	"testing"

	"github.com/inboxmill/inboxmill/tests/chaos/internal/wire"
)

// The model must accept a correct history and reject one with an effect
// that happened twice and one where a conflicting payload was acked.
func TestExactlyOnceModel(t *testing.T) {
	h1 := wire.PayloadHash("evt-1", 100)
	h2 := wire.PayloadHash("evt-1", 150) // the conflicting payload
	hOther := wire.PayloadHash("evt-2", 200)
	const end = 1_000_000
	correct := []wire.HistoryOp{
		// Two deliveries of evt-1 race; one makes the effect and acks, the
		// other is acked as a duplicate; the conflicting payload is claimed
		// and refused (no ack). evt-2's effect is in an open-ended commit.
		{Op: wire.OpClaim, Key: "evt-1", Hash: h1, Call: 10, Ret: 11},
		{Op: wire.OpEffect, Key: "evt-1", Hash: h1, Call: 12},
		{Op: wire.OpCommit, Key: "evt-1", Hash: h1, Call: 10, Ret: 20},
		{Op: wire.OpAck, Key: "evt-1", Hash: h1, Call: 10, Ret: 21},
		{Op: wire.OpAck, Key: "evt-1", Hash: h1, Call: 15, Ret: 30},
		{Op: wire.OpClaim, Key: "evt-1", Hash: h2, Call: 40, Ret: 41},
		{Op: wire.OpAck, Key: "evt-2", Hash: hOther, Call: 5, Ret: 6, Open: true},
		{Op: wire.OpEffect, Key: "evt-2", Hash: hOther, Call: 50},
	}
	tests := []struct {
		name    string
		extra   []wire.HistoryOp
		illegal []string
	}{
		{"correct", nil, nil},
		{"duplicated effect", []wire.HistoryOp{{Op: wire.OpEffect, Key: "evt-1", Hash: h1, Call: 60}}, []string{"evt-1"}},
		{"acked conflict", []wire.HistoryOp{{Op: wire.OpAck, Key: "evt-1", Hash: h2, Call: 40, Ret: 45}}, []string{"evt-1"}},
		{"acked before its effect", []wire.HistoryOp{{Op: wire.OpAck, Key: "evt-3", Hash: h1, Call: 1, Ret: 2},
			{Op: wire.OpEffect, Key: "evt-3", Hash: h1, Call: 3}}, []string{"evt-3"}},
		{"acked, never done", []wire.HistoryOp{{Op: wire.OpAck, Key: "evt-4", Hash: h1, Call: 1, Ret: 2, Open: true}},
			[]string{"evt-4"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := checkHistory(append(append([]wire.HistoryOp(nil), correct...), tc.extra...), end)
			if want := len(tc.illegal) == 0; v.linearizable != want {
				t.Fatalf("linearizable = %t, want %t (illegal keys %v)", v.linearizable, want, v.illegal)
			}
			if len(tc.illegal) > 0 && (len(v.illegal) != 1 || v.illegal[0] != tc.illegal[0]) {
				t.Fatalf("illegal keys %v, want %v", v.illegal, tc.illegal)
			}
		})
	}
}
