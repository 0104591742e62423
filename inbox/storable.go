package inbox

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits on the outcome columns, in bytes: what every dialect's schema
// stores (MySQL's VARCHAR(255) and TEXT).
const (
	MaxExternalRefLen = 255
	MaxResourceIDLen  = 255
	MaxErrorLen       = 4096
)

// StorableText returns s as text every dialect stores unchanged: bytes
// that are not UTF-8 and NUL bytes become U+FFFD, and the result is cut at
// a rune boundary to at most max bytes (max < 0: no limit). For
// descriptive text — an error message — where a readable approximation
// beats a refusal.
func StorableText(s string, max int) string {
	if CheckText(s, max) == nil {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if max >= 0 && len(s) > max {
		s = s[:max]
		for len(s) > 0 && !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// storableOutcome makes p's outcome columns storable before they reach
// SQL. The error text is made storable in place; an external reference or
// resource ID that is not storable text within its limit is an identifier
// that must not be changed into another one, so it is dropped, and the
// error says so. A result refused by the store's limit (tooLarge, from
// CheckResult) is dropped too. It returns what was dropped ("" when
// nothing was).
func storableOutcome(p *params, tooLarge error) string {
	var dropped []string
	if tooLarge != nil {
		dropped = append(dropped, fmt.Sprintf("result (%s)", tooLarge))
		p.result = nil
	}
	if err := CheckText(p.externalRef, MaxExternalRefLen); err != nil {
		dropped = append(dropped, fmt.Sprintf("external reference (%s)", err))
		p.externalRef = ""
	}
	if err := CheckText(p.resourceID, MaxResourceIDLen); err != nil {
		dropped = append(dropped, fmt.Sprintf("resource ID (%s)", err))
		p.resourceID = ""
	}
	what := strings.Join(dropped, ", ")
	if what != "" {
		p.errS = "not storable, dropped: " + what + "; " + p.errS
	}
	p.errS = StorableText(p.errS, MaxErrorLen)
	return what
}
