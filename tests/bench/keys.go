package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
)

// keyOrder is how event IDs are made, for the growth and purge scenarios
// (--keys). Every event ID is "evt-" and a UUID in its text form:
//
//   - random: a version 4 UUID, so that a new key lands anywhere in the
//     primary key, like most event IDs today;
//   - uuidv7: a version 7 UUID (RFC 9562), whose first 48 bits are a Unix
//     millisecond timestamp and the next 12 a counter within the
//     millisecond (github.com/google/uuid keeps them increasing within the
//     process), so that keys sort by the time they were made and a new
//     key lands at the right edge of the primary key.
type keyOrder string

const (
	keysRandom keyOrder = "random"
	keysUUIDv7 keyOrder = "uuidv7"
)

var keyOrders = []keyOrder{keysRandom, keysUUIDv7}

// parseKeys reads --keys: a list of key orders, returned in keyOrders'
// order whatever the order given.
func parseKeys(s string) ([]keyOrder, error) {
	var out []keyOrder
	for _, k := range splitList(s) {
		if !slices.Contains(keyOrders, keyOrder(k)) {
			return nil, fmt.Errorf("--keys: unknown key order %q (random, uuidv7)", k)
		}
		out = append(out, keyOrder(k))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--keys: no key order in %q", s)
	}
	slices.SortFunc(out, func(a, b keyOrder) int { return slices.Index(keyOrders, a) - slices.Index(keyOrders, b) })
	return slices.Compact(out), nil
}

// eventID makes a fresh event ID.
func (k keyOrder) eventID() string {
	if k == keysUUIDv7 {
		return "evt-" + uuid.Must(uuid.NewV7()).String()
	}
	return "evt-" + watermill.NewUUID()
}

// scenario names a measurement of base at an inbox size: growth_10m for
// random keys (the names the scenario always had), growth_uuidv7_10m for
// time-ordered ones.
func (k keyOrder) scenario(base string, size int64) string {
	if k == keysRandom {
		return base + "_" + sizeLabel(size)
	}
	return base + "_" + string(k) + "_" + sizeLabel(size)
}

// seedKey is the SQL expression of a seeded row's key on dialect d, from
// the columns of seed's row source: n, the row number; h, origin + n as
// 12 hex digits (a millisecond timestamp); m, 32 random-looking hex digits
// (an MD5 of the row number; random bytes on SQLite). Random keys are
// "evt-" and m, as the growth scenario always seeded them; uuidv7 keys are
// the text form of a version 7 UUID: h, then the version 7 and 12 bits of
// m, then the variant (8, 9, a or b) and 62 more bits of m. Row n+1's key
// sorts after row n's.
func (k keyOrder) seedKey(d string) string {
	concat := func(parts ...string) string {
		if d == "mysql" {
			return "CONCAT(" + strings.Join(parts, ", ") + ")"
		}
		return strings.Join(parts, " || ")
	}
	if k == keysRandom {
		return concat("'evt-'", "m")
	}
	ascii := "ascii"
	if d == "sqlite" {
		ascii = "unicode"
	}
	return concat("'evt-'", "substr(h, 1, 8)", "'-'", "substr(h, 9, 4)", "'-7'", "substr(m, 1, 3)", "'-'",
		"substr('89ab', "+ascii+"(substr(m, 4, 1)) % 4 + 1, 1)", "substr(m, 5, 3)", "'-'", "substr(m, 8, 12)")
}
