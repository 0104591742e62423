package dedup_test

import (
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/deduptest"
)

// The instants an event time may name: after the Unix epoch, before the
// year 10000 (what RFC 3339 can write).
var (
	epoch     = time.Unix(0, 0).UTC()
	year10000 = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	// maxErrorLen bounds a refusal's message: it names the value cut to
	// 64 bytes, which quoting turns into at most 256 characters (\x9c for
	// each byte that is not UTF-8), and some words around it.
	maxErrorLen = 400
)

// FuzzEventTimeFromMetadata feeds any metadata value to
// EventTimeFromMetadata, the parser of a producer's event time.
// Invariants:
//
//   - it never panics;
//   - an accepted time is in UTC, after the epoch and before the year
//     10000, whichever form it came in;
//   - digits alone are whole milliseconds since the epoch, exactly;
//     anything else accepted is an RFC 3339 time, the same instant as
//     time.Parse reads;
//   - a refusal's message stays short whatever the value's length: the
//     value is cut, so a megabyte of metadata does not become a megabyte
//     of log line or poison-queue header.
//
// The seed corpus is testdata/fuzz/FuzzEventTimeFromMetadata.
func FuzzEventTimeFromMetadata(f *testing.F) {
	get := dedup.EventTimeFromMetadata("event_time")
	f.Fuzz(func(t *testing.T, v string) {
		got, err := get(deduptest.NewMessage("e", `{}`, "event_time", v))
		if err != nil {
			if len(err.Error()) > maxErrorLen {
				t.Fatalf("%d-byte error for a %d-byte value: %.100s...", len(err.Error()), len(v), err)
			}
			return
		}
		if got.Location() != time.UTC {
			t.Fatalf("%q: %v is not in UTC", v, got)
		}
		if !got.After(epoch) || !got.Before(year10000) {
			t.Fatalf("%q: %v is outside the instants an event time may name", v, got)
		}
		if ms, perr := strconv.ParseInt(v, 10, 64); perr == nil {
			if got.UnixMilli() != ms || got.Nanosecond()%int(time.Millisecond) != 0 {
				t.Fatalf("%q: %v is not %d ms after the epoch", v, got, ms)
			}
			return
		}
		want, perr := time.Parse(time.RFC3339Nano, v)
		if perr != nil || !want.Equal(got) {
			t.Fatalf("%q: %v, but time.Parse reads %v, %v", v, got, want, perr)
		}
	})
}

// FuzzUUIDv7Time feeds any key to UUIDv7Time. Invariants:
//
//   - it never panics;
//   - it accepts only the canonical text of an RFC 9562 UUID (8-4-4-4-12
//     hex digits) of version 7 and variant 10;
//   - the time it returns is exactly the UUID's first 48 bits as
//     milliseconds since the epoch, after the epoch and before the year
//     10000;
//   - a refusal's message stays short whatever the key's length.
//
// The seed corpus is testdata/fuzz/FuzzUUIDv7Time.
func FuzzUUIDv7Time(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		got, err := dedup.UUIDv7Time(s)
		if err != nil {
			if len(err.Error()) > maxErrorLen {
				t.Fatalf("%d-byte error for a %d-byte key", len(err.Error()), len(s))
			}
			return
		}
		if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
			t.Fatalf("%q accepted: not 8-4-4-4-12", s)
		}
		b, herr := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
		if herr != nil || len(b) != 16 {
			t.Fatalf("%q accepted: not hex", s)
		}
		if b[6]>>4 != 7 || b[8]>>6 != 2 {
			t.Fatalf("%q accepted: version %d, variant %b", s, b[6]>>4, b[8]>>6)
		}
		ms, _ := strconv.ParseInt(s[:8]+s[9:13], 16, 64)
		if got.UnixMilli() != ms || got.Location() != time.UTC {
			t.Fatalf("%q: %v, not %d ms after the epoch", s, got, ms)
		}
		if !got.After(epoch) || !got.Before(year10000) {
			t.Fatalf("%q: %v is outside the instants an event time may name", s, got)
		}
	})
}
