package inbox_test

import (
	"testing"
	"unicode/utf8"

	"github.com/inboxmill/inboxmill/inbox"
)

func TestStorableText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 10, "plain"},
		{"nul\x00byte", -1, "nul\uFFFDbyte"},
		{"bad\xffutf8", -1, "bad\uFFFDutf8"},
		{"abcdef", 3, "abc"},
		{"ab\u00e9", 3, "ab"}, // é is two bytes: cut before it, not through it
		{"\x00\x00", 3, "\uFFFD"},
	} {
		got := inbox.StorableText(tc.in, tc.max)
		if got != tc.want {
			t.Errorf("StorableText(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
		if inbox.CheckText(got, tc.max) != nil || !utf8.ValidString(got) {
			t.Errorf("StorableText(%q, %d) = %q is not storable", tc.in, tc.max, got)
		}
	}
}
