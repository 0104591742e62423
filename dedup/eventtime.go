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
// since the Unix epoch, as Kafka record timestamps are.
func EventTimeFromMetadata(key string) EventTimeFunc {
	return func(msg *message.Message) (time.Time, error) {
		v := msg.Metadata.Get(key)
		if v == "" {
			return time.Time{}, fmt.Errorf("metadata %q is missing", key)
		}
		return parseEventTime(v)
	}
}

func parseEventTime(v string) (time.Time, error) {
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		if ms <= 0 {
			return time.Time{}, fmt.Errorf("event time %d ms is not after the epoch", ms)
		}
		return time.UnixMilli(ms).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("event time %q is neither RFC 3339 nor Unix milliseconds", v)
	}
	return t.UTC(), nil
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
// precision), from its canonical text form.
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
	var ms int64
	for _, c := range b[:6] {
		ms = ms<<8 | int64(c)
	}
	return time.UnixMilli(ms).UTC(), nil
}

func truncateForError(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
