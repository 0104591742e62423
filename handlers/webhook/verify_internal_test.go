package webhook

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCheckTimestampExtremes covers instants no header can carry (the
// verifiers parse unsigned seconds only) but a Now function can return:
// checkTimestamp must refuse any pair further apart than the tolerance,
// whichever is later and however far apart they are.
func TestCheckTimestampExtremes(t *testing.T) {
	t.Parallel()
	now := time.Unix(1700000000, 0)
	far := []time.Time{
		{}, // January 1, year 1
		time.Unix(-1<<62, 0),
		time.Unix(math.MinInt64/2, 0),
		time.Unix(1<<62, 0),
		time.Unix(math.MaxInt64-62135596800, 999999999), // the latest time.Time
	}
	for _, tolerance := range []time.Duration{0, time.Hour, 100 * 365 * 24 * time.Hour, 1<<63 - 1} {
		for i, x := range far {
			t.Run(fmt.Sprintf("%v/%d", tolerance, i), func(t *testing.T) {
				t.Parallel()
				require.ErrorIs(t, checkTimestamp(x, now, tolerance), ErrTimestampOutOfRange, "signed at %v", x)
				require.ErrorIs(t, checkTimestamp(now, x, tolerance), ErrTimestampOutOfRange, "clock at %v", x)
				require.NoError(t, checkTimestamp(x, x, tolerance), "signed now, at %v", x)
			})
		}
	}

	// The edges: the tolerance itself is accepted, a nanosecond more is not.
	for _, tolerance := range []time.Duration{time.Minute, 1<<63 - 1} {
		require.NoError(t, checkTimestamp(now.Add(tolerance), now, tolerance))
		require.NoError(t, checkTimestamp(now.Add(-tolerance), now, tolerance))
		require.ErrorIs(t, checkTimestamp(now.Add(tolerance).Add(1), now, tolerance), ErrTimestampOutOfRange)
		require.ErrorIs(t, checkTimestamp(now.Add(-tolerance).Add(-1), now, tolerance), ErrTimestampOutOfRange)
	}
	require.NoError(t, checkTimestamp(time.Time{}, now, -1), "-1 disables the check")
}
