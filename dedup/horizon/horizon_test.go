package horizon_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/dedup/horizon"
)

const day = 24 * time.Hour

func topic(age time.Duration) horizon.Horizon {
	return horizon.Horizon{Name: "topic orders", Age: age, Oldest: -1}
}

// TestCompare pins the verdict and the sentence for each kind of horizon.
func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h       horizon.Horizon
		inbox   time.Duration
		safe    bool
		message string
		err     error
	}{
		{"inbox forgets sooner", topic(30 * day), 7 * day, false,
			"the inbox keeps records for 7d but topic orders keeps messages for 30d: messages older than 7d would run again",
			horizon.ErrHorizonExceeded},
		{"equal", topic(7 * day), 7 * day, true,
			"the inbox keeps records for 7d and topic orders keeps messages for 7d: every message that can come again is recognised", nil},
		{"inbox outlives", topic(36 * time.Hour), 7 * day, true,
			"the inbox keeps records for 7d and topic orders keeps messages for 1d12h: every message that can come again is recognised", nil},
		{"one millisecond short", topic(7 * day), 7*day - time.Millisecond, false,
			"the inbox keeps records for 6d23h59m59.999s but topic orders keeps messages for 7d: messages older than 6d23h59m59.999s would run again",
			horizon.ErrHorizonExceeded},
		{"topic forever", topic(horizon.Forever), 7 * day, false,
			"the inbox keeps records for 7d but topic orders keeps messages forever: messages older than 7d would run again",
			horizon.ErrHorizonExceeded},
		{"inbox forever", topic(horizon.Forever), horizon.Forever, true,
			"the inbox keeps records forever and topic orders keeps messages forever: every message that can come again is recognised", nil},
		{"by size", horizon.Horizon{Name: "topic orders", Age: horizon.Forever, BySize: true, Note: "retention.bytes=1000"},
			7 * day, false,
			"the inbox keeps records for 7d but topic orders keeps messages up to a size, not a time (retention.bytes=1000): " +
				"how old a message can be depends on the traffic; messages older than 7d would run again",
			horizon.ErrHorizonUnknown},
		{"within the grace", horizon.Horizon{Name: "topic orders", Age: 7 * day, Grace: 7 * day}, 10 * day, true,
			"the inbox keeps records for 10d and topic orders keeps messages for 7d: every message that can come again is " +
				"recognised; a message may stay readable up to 7d longer (whole segments are deleted), so a retention of 14d leaves no gap",
			nil},
		{"past the grace", horizon.Horizon{Name: "topic orders", Age: 7 * day, Grace: 7 * day}, 14 * day, true,
			"the inbox keeps records for 14d and topic orders keeps messages for 7d: every message that can come again is recognised", nil},
		{"nothing can come again", horizon.Horizon{Name: "table q", Age: 0, Note: "the table is empty"}, time.Minute, true,
			"the inbox keeps records for 1m and table q keeps messages for 0s (the table is empty): every message that can come again is recognised", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := horizon.Compare(tc.h, tc.inbox)
			require.Equal(t, tc.safe, r.Safe)
			require.Equal(t, tc.message, r.Message)
			require.Equal(t, tc.message, r.String())
			require.Equal(t, tc.inbox, r.InboxRetention)
			require.Equal(t, tc.h, r.Horizon)
			if tc.err == nil {
				require.NoError(t, r.Err())
				return
			}
			require.ErrorIs(t, r.Err(), tc.err)
			require.EqualError(t, r.Err(), tc.message)
			other := horizon.ErrHorizonUnknown
			if tc.err == horizon.ErrHorizonUnknown {
				other = horizon.ErrHorizonExceeded
			}
			require.NotErrorIs(t, r.Err(), other)
		})
	}
}

// TestCheckDefaults: the inbox retention takes dedup.Config.Retention's
// values, 0 included.
func TestCheckDefaults(t *testing.T) {
	ctx := context.Background()
	src := horizon.Fixed(topic(30 * day))
	r, err := horizon.Check(ctx, src, 0)
	require.NoError(t, err)
	require.Equal(t, dedup.DefaultRetention, r.InboxRetention)
	require.False(t, r.Safe)

	r, err = horizon.Check(ctx, src, -1)
	require.NoError(t, err)
	require.True(t, r.Safe)
	require.Equal(t, horizon.Forever, r.InboxRetention)

	_, err = horizon.Check(ctx, src, -time.Second)
	require.ErrorContains(t, err, "negative")
	_, err = horizon.Check(ctx, nil, time.Hour)
	require.Error(t, err)
	_, err = horizon.Check(ctx, horizon.Fixed(topic(-2)), time.Hour)
	require.ErrorContains(t, err, "negative age")

	boom := errors.New("boom")
	_, err = horizon.Check(ctx, horizon.SourceFunc(func(context.Context) (horizon.Horizon, error) {
		return horizon.Horizon{}, boom
	}), time.Hour)
	require.ErrorIs(t, err, boom)
}

// TestRequire is the strict setting: an error to branch on when unsafe,
// nil when safe, and the source's own error passed through.
func TestRequire(t *testing.T) {
	ctx := context.Background()
	r, err := horizon.Require(ctx, horizon.Fixed(topic(30*day)), 7*day)
	require.ErrorIs(t, err, horizon.ErrHorizonExceeded)
	require.False(t, r.Safe)
	require.EqualError(t, err, r.Message)

	r, err = horizon.Require(ctx, horizon.Fixed(topic(7*day)), 30*day)
	require.NoError(t, err)
	require.True(t, r.Safe)

	_, err = horizon.Require(ctx, horizon.Fixed(horizon.Horizon{Age: horizon.Forever, BySize: true}), 30*day)
	require.ErrorIs(t, err, horizon.ErrHorizonUnknown)
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		7 * day:                             "7d",
		36 * time.Hour:                      "1d12h",
		3*day + 4*time.Hour + 5*time.Minute: "3d4h5m",
		day + 30*time.Second:                "1d30s",
		day + 10*time.Minute:                "1d10m",
		4 * time.Hour:                       "4h",
		90 * time.Minute:                    "1h30m",
		time.Minute:                         "1m",
		1500 * time.Millisecond:             "1.5s",
		10 * time.Second:                    "10s",
		7*day - time.Millisecond:            "6d23h59m59.999s",
		0:                                   "0s",
		horizon.Forever:                     "forever",
	} {
		require.Equal(t, want, horizon.FormatDuration(d), d)
	}
}

func TestHorizonString(t *testing.T) {
	require.Equal(t, "the transport keeps messages for 1h", horizon.Horizon{Age: time.Hour}.String())
	require.True(t, horizon.Horizon{Age: horizon.Forever, BySize: true}.Unknown())
	require.False(t, horizon.Horizon{Age: horizon.Forever}.Unknown())
	require.False(t, horizon.Horizon{Age: time.Hour, BySize: true}.Unknown(), "a time bound is known whatever the size bound")
}
