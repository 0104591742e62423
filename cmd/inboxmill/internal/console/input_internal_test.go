package console

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParseAge checks the record list's age filter. Invariants: it never
// panics; an age it accepts is not negative; a whole number of days it
// accepts is that many days exactly; and what it refuses it refuses with
// the sentence the page shows.
func FuzzParseAge(f *testing.F) {
	for _, s := range []string{"90s", "15m", "2h", "3d", "1.5d", "0d", "-1d", "1e10d", "Infd", "NaNd", "0x10d", "106751d",
		"106752d", "99999999999d", "9223372036854775807ns", "1h30m", ".5d", "5.d", "d", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseAge(s)
		if err != nil {
			if !strings.Contains(err.Error(), "is not a duration such as") {
				t.Fatalf("parseAge(%q): %v", s, err)
			}
			return
		}
		if d < 0 {
			t.Fatalf("parseAge(%q) = %v, negative", s, d)
		}
		if n, ok := strings.CutSuffix(s, "d"); ok {
			if days, err := strconv.Atoi(n); err == nil && d != time.Duration(days)*24*time.Hour {
				t.Fatalf("parseAge(%q) = %v, not %d days", s, d, days)
			}
		}
	})
}

// FuzzParseFilter checks the record list's filter. Invariants: it never
// panics, and a filter it accepts has a valid status or none, a page size
// between 1 and 1000, and no negative age or attempt.
func FuzzParseFilter(f *testing.F) {
	f.Add("status=pending&older_than=1h&attempt_above=2&limit=10")
	f.Add("limit=0&older_than=-1d&attempt_above=-1&status=lost")
	f.Add("limit=99999999999999999999&older_than=99999999999d")
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		fl, err := parseFilter(q, 50)
		if err != nil {
			return
		}
		if fl.Status != "" && !fl.Status.Valid() {
			t.Fatalf("%q: status %q", raw, fl.Status)
		}
		if fl.Limit < 1 || fl.Limit > maxLimit || fl.OlderThan < 0 || fl.AttemptAbove < 0 {
			t.Fatalf("%q: %+v", raw, fl)
		}
	})
}
