package inbox_test

import (
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
