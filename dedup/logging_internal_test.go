package dedup

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
)

// TestRepeatsMemoryIsBounded: however many keys come by, the rate limit
// remembers at most its bound, and forgets the least recently seen first.
func TestRepeatsMemoryIsBounded(t *testing.T) {
	t.Parallel()
	const bound = 8
	r := newRepeats(time.Hour, bound)
	now := time.Now()
	key := func(i int) repeatKey {
		return repeatKey{operation: "op", id: fmt.Sprintf("digest-%d", i), outcome: OutcomeConflict}
	}
	for i := range 10 * bound {
		require.True(t, r.seen(key(i), now).info, "a new key is logged at Info")
		require.LessOrEqual(t, r.len(), bound)
	}
	require.Equal(t, bound, r.len())

	// The newest bound keys are remembered: their repeats are suppressed.
	for i := 9 * bound; i < 10*bound; i++ {
		got := r.seen(key(i), now)
		require.Equal(t, repeat{total: 2, suppressed: 1}, got, "key %d", i)
	}
	// An evicted key starts over.
	require.Equal(t, repeat{info: true, total: 1}, r.seen(key(0), now))
	require.Equal(t, bound, r.len())

	// Seeing a key again keeps it: the least recently seen goes instead.
	r = newRepeats(time.Hour, 2)
	r.seen(key(1), now)
	r.seen(key(2), now)
	r.seen(key(1), now)
	r.seen(key(3), now) // evicts 2
	require.False(t, r.seen(key(1), now).info, "1 was seen recently and is remembered")
	require.True(t, r.seen(key(2), now).info, "2 was evicted")
}

// TestRepeatsWindow pins the counting: Info first, Debug within the
// interval, Info with the suppressed count after it, and a fresh start
// after a whole quiet interval.
func TestRepeatsWindow(t *testing.T) {
	t.Parallel()
	r := newRepeats(time.Minute, DefaultRepeatLogKeys)
	k := repeatKey{operation: "op", id: "d", outcome: OutcomeConflict}
	t0 := time.Now()
	at := func(d time.Duration) repeat { return r.seen(k, t0.Add(d)) }

	require.Equal(t, repeat{info: true, total: 1}, at(0))
	require.Equal(t, repeat{total: 2, suppressed: 1}, at(20*time.Second))
	require.Equal(t, repeat{total: 3, suppressed: 2}, at(40*time.Second))
	require.Equal(t, repeat{info: true, total: 4, suppressed: 2}, at(60*time.Second))
	require.Equal(t, repeat{total: 5, suppressed: 1}, at(61*time.Second))
	require.Equal(t, repeat{info: true, total: 1}, at(3*time.Minute), "quiet for over an interval: starts over")

	require.Nil(t, newRepeats(-1, DefaultRepeatLogKeys), "-1: no limit")
}

// TestDefaultLogger: no Logger means slog.Default() through watermill's
// adapter, asked for its level before a line is built.
func TestDefaultLogger(t *testing.T) {
	t.Parallel()
	l := newLogger(nil)
	require.IsType(t, &watermill.SlogLoggerAdapter{}, l.LoggerAdapter)
	require.Same(t, slog.Default(), l.slog)
	require.False(t, l.off)
	require.Equal(t, slog.Default().Enabled(t.Context(), slog.LevelDebug), l.enabled(slog.LevelDebug))

	nop := newLogger(watermill.NopLogger{})
	require.True(t, nop.off)
	require.False(t, nop.enabled(slog.LevelInfo))

	given := newLogger(watermill.NewStdLogger(false, false))
	require.Nil(t, given.slog)
	require.True(t, given.enabled(slog.LevelDebug), "a given adapter filters itself")
}
