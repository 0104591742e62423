package dedup_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/deduptest"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/inbox/inboxtest"
	"github.com/inboxmill/inboxmill/inbox/postgres"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

func TestEventTimeFromMetadata(t *testing.T) {
	get := dedup.EventTimeFromMetadata("event_time")
	for in, want := range map[string]time.Time{
		"2026-11-30T10:00:00Z":               time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC),
		"2026-11-30T11:00:00.5+01:00":        time.Date(2026, 11, 30, 10, 0, 0, 500_000_000, time.UTC),
		strconv.FormatInt(1764496800000, 10): time.UnixMilli(1764496800000).UTC(),
	} {
		got, err := get(deduptest.NewMessage("e", `{}`, "event_time", in))
		require.NoError(t, err, in)
		assert.True(t, want.Equal(got), "%s: %v", in, got)
	}
	for _, bad := range []string{"", "yesterday", "-5", "2026-11-30",
		"0", "9223372036854775807", "9223372036854775808", // the epoch itself; the largest int64; beyond it
		"1764496800000000",          // microseconds where milliseconds belong: the year 57,884
		"253402300800000",           // 10000-01-01 in milliseconds
		"1969-12-31T23:59:59Z",      // before the epoch
		"0001-01-01T00:00:00Z",      // the zero time.Time, which would read as "no event time"
		"9999-12-31T23:00:00-01:00", // the year 10000 in UTC
		"2026-11-30T10:00:00+25:00", // no such offset
		"2026-02-30T10:00:00Z",      // no such day
		"2026-11-30t10:00:00z",      // RFC 3339 allows lower case; Go's parser does not
		" 2026-11-30T10:00:00Z",     // surrounding space
		"2026-11-30T10:00:00Z\x00",  // a NUL byte
		strings.Repeat("9", 1<<20),  // a megabyte of digits
	} {
		md := []string{}
		if bad != "" {
			md = []string{"event_time", bad}
		}
		_, err := get(deduptest.NewMessage("e", `{}`, md...))
		if assert.Error(t, err, "%.40q", bad) {
			assert.Less(t, len(err.Error()), 200, "the error cuts the value: %.100s", err)
		}
	}
	// Odd but meaningful forms are read as the instant they name.
	for in, want := range map[string]time.Time{
		"+1764496800000":                    time.UnixMilli(1764496800000).UTC(),
		"253402300799999":                   time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC),
		"2026-11-30T10:00:00+23:59":         time.Date(2026, 11, 29, 10, 1, 0, 0, time.UTC),
		"2026-11-30T10:00:00.123456789123Z": time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.UTC), // Go keeps nine digits
	} {
		got, err := get(deduptest.NewMessage("e", `{}`, "event_time", in))
		require.NoError(t, err, in)
		assert.True(t, want.Equal(got), "%s: %v", in, got)
	}
}

func TestUUIDv7Time(t *testing.T) {
	// RFC 9562, appendix A.6: 017F22E2-79B0-7CC3-98C4-DC0C0C07398F was
	// created at 2022-02-22T19:22:22Z.
	got, err := dedup.UUIDv7Time("017f22e2-79b0-7cc3-98c4-dc0c0c07398f")
	require.NoError(t, err)
	assert.Equal(t, time.Date(2022, 2, 22, 19, 22, 22, 0, time.UTC), got)
	for _, bad := range []string{"", "evt-1", "6ba7b810-9dad-41d1-80b4-00c04fd430c8", "017f22e2-79b0-7cc3-98c4-dc0c0c07398z",
		"017f22e2-79b0-7cc3-18c4-dc0c0c07398f", // variant 0: not an RFC 9562 UUID
		"017f22e2-79b0-7cc3-e8c4-dc0c0c07398f", // variant 11 (reserved)
		"00000000-0000-7000-8000-000000000000", // the epoch itself
		"ffffffff-ffff-7fff-bfff-ffffffffffff", // the year 10889
		"017f22e279b07cc398c4dc0c0c07398f",     // no hyphens
		"017f22e-279b0-7cc3-98c4-dc0c0c07398f", // hyphens moved
	} {
		_, err := dedup.UUIDv7Time(bad)
		assert.Error(t, err, bad)
	}
}

// TestEventTimeRefusals: a message whose event time cannot be read, and
// one whose event is older than the partitioned inbox keeps records, are
// poison: the handler does not run, the error is returned (no ack), and a
// redelivery gets the same answer. An old event whose record is still
// kept is a duplicate as ever.
func TestEventTimeRefusals(t *testing.T) {
	for _, mode := range []dedup.Mode{dedup.Transactional{}, dedup.Transactional{Group: &dedup.Group{}},
		dedup.Reserve{Owner: "w", Lease: time.Minute}} {
		t.Run(fmt.Sprintf("%T", mode), func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, testdb.PostgresPGX)
			part := postgres.Partitions{Width: 24 * time.Hour, Retention: 2 * 24 * time.Hour}
			store := inboxtest.NewStore(t, db, postgres.Partitioned(part), inbox.Config{})
			d, err := dedup.New(store, dedup.Config{
				Key:       dedup.KeyFromMetadata("event_id"),
				Operation: "ship",
				EventTime: dedup.EventTimeFromMetadata("event_time"),
				Mode:      mode,
			})
			require.NoError(t, err)
			var runs atomic.Int64
			h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				runs.Add(1)
				if tx, ok := dedup.TxFromContext(msg.Context()); ok {
					var one int
					return nil, tx.QueryRowContext(msg.Context(), "SELECT 1").Scan(&one)
				}
				return nil, nil
			})
			now := time.Now().UTC()
			at := func(t time.Time) string { return t.Format(time.RFC3339Nano) }

			for range 2 {
				_, err = h(deduptest.NewMessage("no-time", `{}`))
				require.ErrorIs(t, err, dedup.ErrInvalidEventTime)
				assert.True(t, dedup.IsPoison(err))

				_, err = h(deduptest.NewMessage("ancient", `{}`, "event_time", at(now.Add(-5*24*time.Hour))))
				require.ErrorIs(t, err, dedup.ErrBeyondRetention)
				assert.True(t, dedup.IsPoison(err))
				assert.False(t, dedup.IsRetryable(err))
			}
			assert.Zero(t, runs.Load(), "no refused message ran")

			recent := deduptest.NewMessage("recent", `{}`, "event_time", at(now.Add(-time.Hour)))
			_, err = h(recent)
			require.NoError(t, err)
			_, err = h(deduptest.NewMessage("recent", `{}`, "event_time", at(now.Add(-time.Hour))))
			require.NoError(t, err)
			assert.Equal(t, int64(1), runs.Load())
			st := d.Stats()
			assert.Equal(t, uint64(4), st.Invalid)
			assert.Equal(t, uint64(1), st.Duplicates)

			var bucket time.Time
			require.NoError(t, db.QueryRowContext(context.Background(),
				`SELECT bucket FROM "`+store.Table()+`" WHERE key = 'recent'`).Scan(&bucket))
			assert.Equal(t, now.Add(-time.Hour).Truncate(24*time.Hour), bucket.UTC(), "the record is in its event's bucket")
		})
	}
}

// TestDryRunOnPartitionedStore: a dry run predicts the refusal of an event
// whose bucket closed and that has no record (invalid, ErrBeyondRetention),
// and answers one that still has its record as a duplicate.
func TestDryRunOnPartitionedStore(t *testing.T) {
	db := testdb.Open(t, testdb.PostgresPGX)
	store := inboxtest.NewStore(t, db, postgres.Partitioned(postgres.Partitions{Retention: 48 * time.Hour}), inbox.Config{})
	d, err := dedup.New(store, dedup.Config{
		Key:       dedup.KeyFromMetadata("event_id"),
		Operation: "ship",
		EventTime: dedup.EventTimeFromMetadata("event_time"),
	})
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Now().UTC()
	old := now.Add(-5 * 24 * time.Hour).Format(time.RFC3339)
	recent := now.Add(-time.Hour).Format(time.RFC3339)

	res, err := d.DryRun(ctx, deduptest.NewMessage("gone", `{}`, "event_time", old), time.Time{})
	require.NoError(t, err)
	assert.Equal(t, dedup.DryRunInvalid, res.Class)
	require.ErrorIs(t, res.Err, dedup.ErrBeyondRetention)

	res, err = d.DryRun(ctx, deduptest.NewMessage("fresh", `{}`, "event_time", recent), time.Time{})
	require.NoError(t, err)
	assert.Equal(t, dedup.DryRunNew, res.Class)

	_, err = d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(
		deduptest.NewMessage("fresh", `{}`, "event_time", recent))
	require.NoError(t, err)
	res, err = d.DryRun(ctx, deduptest.NewMessage("fresh", `{}`, "event_time", recent), time.Time{})
	require.NoError(t, err)
	assert.Equal(t, dedup.DryRunDuplicate, res.Class)
}
