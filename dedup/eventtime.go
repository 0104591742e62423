package dedup

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// EventTimeFunc reads when the event a message carries happened: the time
// its producer assigned, the same in every delivery of the event. See
// Config.EventTime.
type EventTimeFunc func(msg *message.Message) (time.Time, error)

// EventTimeFromMetadata reads the event time from the metadata field key:
// RFC 3339 (with or without fractional seconds), or whole milliseconds
// since the Unix epoch, as Kafka record timestamps are. Either form must
// name an instant after the epoch and before the year 10000 (the last
// RFC 3339 can write); anything else is refused, such as a time in
// microseconds where milliseconds belong (the year 57,000), which would
// otherwise be filed in the newest partition.
func EventTimeFromMetadata(key string) EventTimeFunc {
	return func(msg *message.Message) (time.Time, error) {
		v := msg.Metadata.Get(key)
		if v == "" {
			return time.Time{}, fmt.Errorf("metadata %q is missing", key)
		}
		return parseEventTime(v)
	}
}

// lastEventTime bounds the instants an event time may name: before the
// year 10000, in both forms.
var lastEventTime = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)

func parseEventTime(v string) (time.Time, error) {
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		if ms <= 0 {
			return time.Time{}, fmt.Errorf("event time %d ms is not after the epoch", ms)
		}
		t := time.UnixMilli(ms).UTC()
		if !t.Before(lastEventTime) {
			return time.Time{}, fmt.Errorf("event time %d ms is after the year 9999: not milliseconds since the epoch", ms)
		}
		return t, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("event time %q is neither RFC 3339 nor Unix milliseconds", truncateForError(v))
	}
	return checkEventTime(t.UTC(), v)
}

// checkEventTime refuses a time outside the epoch to the year 9999,
// which RFC 3339 text can still name (year 0000, or 9999-12-31T23:00:00-01:00).
func checkEventTime(t time.Time, v string) (time.Time, error) {
	if !t.After(time.Unix(0, 0)) || !t.Before(lastEventTime) {
		return time.Time{}, fmt.Errorf("event time %q is not after the epoch and before the year 10000", truncateForError(v))
	}
	return t, nil
}

// EventTimeFromUUIDv7 reads the event time from the idempotency key
// itself, for events identified by a UUIDv7 (RFC 9562), whose first 48
// bits are its creation time in Unix milliseconds. keyFunc is the
// Config.Key the middleware uses; a key that is not a version 7 UUID is
// refused (ErrInvalidEventTime).
func EventTimeFromUUIDv7(keyFunc KeyFunc) EventTimeFunc {
	return func(msg *message.Message) (time.Time, error) {
		key, err := keyFunc(msg)
		if err != nil {
			return time.Time{}, err
		}
		return UUIDv7Time(key)
	}
}

// UUIDv7Time returns the time a version 7 UUID was created at (millisecond
// precision), from its canonical text form: 8-4-4-4-12 hex digits, with
// the version 7 and the RFC 9562 variant (10) bits. Its time must be after
// the epoch and before the year 10000, as EventTimeFromMetadata's.
func UUIDv7Time(s string) (time.Time, error) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return time.Time{}, fmt.Errorf("key %q is not a UUID", truncateForError(s))
	}
	b, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	if err != nil || len(b) != 16 {
		return time.Time{}, fmt.Errorf("key %q is not a UUID", truncateForError(s))
	}
	if b[6]>>4 != 7 {
		return time.Time{}, fmt.Errorf("key %s is a version %d UUID, not version 7", s, b[6]>>4)
	}
	if b[8]>>6 != 2 {
		// The variant bits of an RFC 9562 UUID are 10; other variants
		// lay their bits out otherwise, version and time included.
		return time.Time{}, fmt.Errorf("key %s is not an RFC 9562 UUID (variant bits %02b, not 10)", s, b[8]>>6)
	}
	var ms int64
	for _, c := range b[:6] {
		ms = ms<<8 | int64(c)
	}
	return checkEventTime(time.UnixMilli(ms).UTC(), s)
}

func truncateForError(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
