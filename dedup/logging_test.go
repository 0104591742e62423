package dedup_test

import (
	"context"
	"errors"
	"log"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testkit"
)

const hotKey = "evt-reused-4711" // never to appear in a log line

// hotLoop delivers n conflicting deliveries of hotKey (after the first,
// which executes) to a middleware logging into a recording logger, and
// returns the lines about the conflicts.
func hotLoop(t *testing.T, interval time.Duration, n int, pause time.Duration) []testkit.LogEntry {
	t.Helper()
	logger := testkit.NewLogger()
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op",
		Logger: logger, RepeatLogInterval: interval})
	require.NoError(t, err)
	h := d.Middleware(noopHandler)
	_, err = h(obsMsg(hotKey, `{"amount":1}`))
	require.NoError(t, err)
	for range n {
		// A new message each time, as a producer reusing the key sends.
		_, err := h(obsMsg(hotKey, `{"amount":2}`))
		require.ErrorIs(t, err, dedup.ErrPayloadConflict)
		time.Sleep(pause)
	}
	require.Equal(t, uint64(n), d.Stats().Conflicts)

	var conflicts []testkit.LogEntry
	for _, e := range logger.Entries() {
		require.NotEqual(t, "error", e.Level, "%s", e)
		require.NotContains(t, e.String(), hotKey, "the raw key is never logged")
		if e.Fields["outcome"] == string(dedup.OutcomeConflict) {
			require.Equal(t, inbox.ID{Operation: "op", Key: hotKey}.Digest(), e.Fields["key_digest"], "%s", e)
			conflicts = append(conflicts, e)
		}
	}
	require.Len(t, conflicts, n, "still one line per delivery")
	return conflicts
}

// TestRepeatedConflictIsLoggedOnce: a producer reusing a key with no
// poison queue in front of the middleware is a hot loop. Within the
// interval only the first conflict reaches Info; the rest are Debug lines
// that count the repeats.
func TestRepeatedConflictIsLoggedOnce(t *testing.T) {
	t.Parallel()
	const n = 300
	lines := hotLoop(t, time.Hour, n, 0)
	require.Equal(t, "info", lines[0].Level)
	require.Equal(t, "inboxmill: key reused with a different payload; refused", lines[0].Msg)
	require.NotContains(t, lines[0].Fields, "repeats", "the first line is an ordinary one")
	for i, e := range lines[1:] {
		require.Equal(t, "debug", e.Level, "repeat %d: %s", i+2, e)
		require.Equal(t, uint64(i+2), e.Fields["repeats"], "%s", e)
		require.NotContains(t, e.Fields, "suppressed")
	}
}

// TestRepeatedConflictIsLoggedOncePerInterval runs the hot loop across
// several intervals: at most one Info line per interval, each counting the
// repeats it stands for.
func TestRepeatedConflictIsLoggedOncePerInterval(t *testing.T) {
	t.Parallel()
	const interval = 100 * time.Millisecond
	start := time.Now()
	lines := hotLoop(t, interval, 120, 5*time.Millisecond)
	elapsed := time.Since(start)

	var infos, debugsSince, first int
	for i, e := range lines {
		if e.Level == "debug" {
			debugsSince++
			require.Equal(t, uint64(i-first+1), e.Fields["repeats"], "%s", e)
			continue
		}
		require.Equal(t, "info", e.Level)
		infos++
		if _, repeated := e.Fields["repeats"]; !repeated {
			// The first line, or the key was quiet for a whole interval (a
			// slow machine) and starts over.
			require.Equal(t, "inboxmill: key reused with a different payload; refused", e.Msg)
			debugsSince, first = 0, i
			continue
		}
		require.Contains(t, e.Msg, "poison queue", "a repeat names the fix: %s", e)
		require.Contains(t, e.Msg, "dedup.IsPoison")
		require.Equal(t, uint64(debugsSince), e.Fields["suppressed"], "line %d: %s", i, e)
		require.Equal(t, uint64(i-first+1), e.Fields["repeats"], "line %d: %s", i, e)
		debugsSince = 0
	}
	require.GreaterOrEqual(t, infos, 2, "the loop outlasted the interval: %v", elapsed)
	require.LessOrEqual(t, infos, int(elapsed/interval)+1, "at most one Info line per interval")
	require.Greater(t, len(lines)-infos, len(lines)/2, "most repeats are Debug lines")
}

// TestRepeatLimitIsPerKeyAndOutcome: keys, and outcomes of one key, are
// limited apart; a message refused before it has a key is told apart by
// its UUID, which a redelivery keeps; -1 turns the limit off.
func TestRepeatLimitIsPerKeyAndOutcome(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T, interval time.Duration) (*testkit.Logger, message.HandlerFunc) {
		logger := testkit.NewLogger()
		store, _ := testkit.SQLiteStore(t, inbox.Config{})
		d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op",
			Logger: logger, RepeatLogInterval: interval})
		require.NoError(t, err)
		return logger, d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if strings.HasPrefix(msg.Metadata.Get("event_id"), "fail") {
				return nil, errors.New("downstream unavailable")
			}
			return nil, nil
		})
	}
	levels := func(logger *testkit.Logger, o dedup.Outcome) []string {
		var out []string
		for _, e := range logger.Entries() {
			if e.Fields["outcome"] == string(o) {
				out = append(out, e.Level)
			}
		}
		return out
	}

	t.Run("keys and outcomes apart", func(t *testing.T) {
		t.Parallel()
		logger, h := setup(t, time.Hour)
		for _, k := range []string{"a", "b"} {
			_, err := h(obsMsg(k, `{"v":1}`))
			require.NoError(t, err)
		}
		for range 3 {
			for _, k := range []string{"a", "b"} {
				_, err := h(obsMsg(k, `{"v":2}`))
				require.ErrorIs(t, err, dedup.ErrPayloadConflict)
			}
			_, err := h(obsMsg("fail-1", `{"v":1}`))
			require.Error(t, err)
		}
		require.Equal(t, []string{"info", "info", "debug", "debug", "debug", "debug"}, levels(logger, dedup.OutcomeConflict))
		require.Equal(t, []string{"info", "debug", "debug"}, levels(logger, dedup.OutcomeRetry),
			"a handler failing on every redelivery is limited too")
	})

	t.Run("a message without a key, redelivered", func(t *testing.T) {
		t.Parallel()
		logger, h := setup(t, time.Hour)
		keyless := obsMsg("", `{}`)
		for range 3 {
			_, err := h(keyless)
			require.ErrorIs(t, err, dedup.ErrMissingKey)
		}
		_, err := h(obsMsg("", `{}`)) // another message
		require.ErrorIs(t, err, dedup.ErrMissingKey)
		require.Equal(t, []string{"info", "debug", "debug", "info"}, levels(logger, dedup.OutcomeInvalid))
	})

	t.Run("off", func(t *testing.T) {
		t.Parallel()
		logger, h := setup(t, -1)
		_, err := h(obsMsg("a", `{"v":1}`))
		require.NoError(t, err)
		for range 3 {
			_, err := h(obsMsg("a", `{"v":2}`))
			require.ErrorIs(t, err, dedup.ErrPayloadConflict)
		}
		require.Equal(t, []string{"info", "info", "info"}, levels(logger, dedup.OutcomeConflict))
		for _, e := range logger.Entries() {
			require.NotContains(t, e.Fields, "repeats")
		}
	})
}

// recordingHandler is a slog.Handler that keeps every record it is given,
// at or above its level.
type recordingHandler struct {
	level slog.Level
	mu    *sync.Mutex
	recs  *[]slog.Record
	attrs []slog.Attr
}

func newRecordingHandler(level slog.Level) *recordingHandler {
	return &recordingHandler{level: level, mu: &sync.Mutex{}, recs: &[]slog.Record{}}
}

func (h *recordingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, r)
	return nil
}

func (h *recordingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	return &c
}

func (h *recordingHandler) WithGroup(string) slog.Handler { return h }

func (h *recordingHandler) records() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), *h.recs...)
}

func recordAttrs(r slog.Record) map[string]string {
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	return m
}

// TestSlogLogger wires the middleware to slog through watermill's adapter:
// Info and Debug land at slog's levels with the fields as attributes.
func TestSlogLogger(t *testing.T) {
	t.Parallel()
	rec := newRecordingHandler(slog.LevelDebug)
	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op",
		Logger: watermill.NewSlogLogger(slog.New(rec))})
	require.NoError(t, err)
	h := d.Middleware(noopHandler)
	_, err = h(obsMsg(hotKey, `{"v":1}`))
	require.NoError(t, err)
	_, err = h(obsMsg(hotKey, `{"v":1}`))
	require.NoError(t, err)
	_, err = h(obsMsg(hotKey, `{"v":2}`))
	require.ErrorIs(t, err, dedup.ErrPayloadConflict)

	recs := rec.records()
	require.Len(t, recs, 3)
	digest := inbox.ID{Operation: "op", Key: hotKey}.Digest()
	for i, want := range []struct {
		level   slog.Level
		outcome dedup.Outcome
	}{{slog.LevelDebug, dedup.OutcomeExecuted}, {slog.LevelDebug, dedup.OutcomeDuplicate}, {slog.LevelInfo, dedup.OutcomeConflict}} {
		r := recs[i]
		attrs := recordAttrs(r)
		require.Equal(t, want.level, r.Level, "%s", r.Message)
		require.Equal(t, string(want.outcome), attrs["outcome"])
		require.Equal(t, digest, attrs["key_digest"])
		require.Equal(t, "op", attrs["operation"])
		require.NotContains(t, r.Message+" "+strings.Join(values(attrs), " "), hotKey)
	}
	require.Contains(t, recordAttrs(recs[2])["error"], digest, "the conflict names the key by its digest")
}

func values(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestDefaultLoggerIsSlogDefault: with no Logger, the middleware logs to
// slog.Default() as it is when New runs, and skips the lines its handler
// would drop. Not parallel: it swaps the process's default logger.
func TestDefaultLoggerIsSlogDefault(t *testing.T) {
	prev, w, flags := slog.Default(), log.Writer(), log.Flags()
	t.Cleanup(func() {
		slog.SetDefault(prev)
		// SetDefault routes package log into the handler; put it back too.
		log.SetOutput(w)
		log.SetFlags(flags)
	})
	rec := newRecordingHandler(slog.LevelInfo)
	slog.SetDefault(slog.New(rec))

	store, _ := testkit.SQLiteStore(t, inbox.Config{})
	d, err := dedup.New(store, dedup.Config{Key: dedup.KeyFromMetadata("event_id"), Operation: "op"})
	require.NoError(t, err)
	h := d.Middleware(noopHandler)
	_, err = h(obsMsg(hotKey, `{"v":1}`))
	require.NoError(t, err)
	_, err = h(obsMsg(hotKey, `{"v":1}`))
	require.NoError(t, err, "a duplicate: Debug, below the handler's level")
	for range 50 {
		_, err = h(obsMsg(hotKey, `{"v":2}`))
		require.ErrorIs(t, err, dedup.ErrPayloadConflict)
	}

	recs := rec.records()
	require.Len(t, recs, 1, "one line for 50 conflicts in a row, none for the rest: %v", recs)
	require.Equal(t, slog.LevelInfo, recs[0].Level)
	require.Equal(t, "inboxmill: key reused with a different payload; refused", recs[0].Message)
	require.Equal(t, inbox.ID{Operation: "op", Key: hotKey}.Digest(), recordAttrs(recs[0])["key_digest"])
}
