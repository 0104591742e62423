package inbox_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// TestIDStringIsSafeToPrint: the printed form names the key by digest only
// and quotes an operation that could drive a terminal.
func TestIDStringIsSafeToPrint(t *testing.T) {
	id := inbox.ID{Scope: "acme", Operation: "ship_order", Key: "customer-42@example.com"}
	require.Equal(t, "ship_order/"+id.Digest(), id.String())
	require.NotContains(t, id.String(), "customer-42")

	evil := inbox.ID{Operation: "op\x1b[2J\x1b]0;PWNED\a", Key: "k"}
	s := evil.String()
	require.False(t, strings.ContainsAny(s, "\x1b\a"), "%q", s)
	require.Equal(t, `"op\x1b[2J\x1b]0;PWNED\a"/`+evil.Digest(), s)

	// Bytes that are not UTF-8 come out escaped too: 0x9b starts a
	// control sequence on a terminal that reads Latin-1.
	raw := inbox.ID{Operation: "op\x9b2J\xff", Key: "k"}
	require.Equal(t, `"op\x9b2J\xff"/`+raw.Digest(), raw.String())

	uni := inbox.ID{Operation: "versand_lieferung_ü", Key: "k"}
	require.Equal(t, "versand_lieferung_ü/"+uni.Digest(), uni.String(), "printable text is left alone")
}

// The digest and the idempotency key are the SHA-256 of the three parts,
// each ended by a NUL: what operators compare with logs, and what
// providers received as idempotency keys, must not change. A long key
// (past the stack buffer) hashes the same way.
func TestDigestAndIdempotencyKeyAreTheSHA256OfTheParts(t *testing.T) {
	for _, id := range []inbox.ID{
		{Operation: "book_carrier", Key: "evt-0003"},
		{Scope: "shop-1", Operation: "book_carrier", Key: "evt-0003"},
		{Scope: "acmé", Operation: "op", Key: strings.Repeat("ключ", 300)},
	} {
		sum := sha256.Sum256([]byte(id.Scope + "\x00" + id.Operation + "\x00" + id.Key + "\x00"))
		want := hex.EncodeToString(sum[:])
		require.Equal(t, want, id.IdempotencyKey())
		require.Equal(t, want[:16], id.Digest())
	}
	// The record the README's operator walk-through inspects.
	require.Equal(t, "2a44e2c57c700612", inbox.ID{Scope: "shop-1", Operation: "book_carrier", Key: "evt-0003"}.Digest())
}
