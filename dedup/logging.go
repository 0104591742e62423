package dedup

import (
	"container/list"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// logger is the middleware's view of Config.Logger.
type logger struct {
	watermill.LoggerAdapter
	// off: the adapter is watermill.NopLogger; no line is worth building.
	off bool
	// slog is the logger behind the default adapter, asked which levels
	// its handler keeps; nil for an adapter the caller gave.
	slog *slog.Logger
}

func newLogger(l watermill.LoggerAdapter) logger {
	if l == nil {
		sl := slog.Default()
		return logger{LoggerAdapter: watermill.NewSlogLogger(sl), slog: sl}
	}
	_, off := l.(watermill.NopLogger)
	return logger{LoggerAdapter: l, off: off}
}

// enabled reports whether a line at level would be kept, so that the
// fields of one that would not are never built.
func (l logger) enabled(level slog.Level) bool {
	if l.off {
		return false
	}
	return l.slog == nil || l.slog.Enabled(context.Background(), level)
}

func (l logger) log(level slog.Level, msg string, fields watermill.LogFields) {
	if level < slog.LevelInfo {
		l.Debug(msg, fields)
		return
	}
	l.Info(msg, fields)
}

// outcomeLevel is the level of a delivery's line: Debug for the outcomes of
// a middleware working as it should, Info for those an operator may act on.
func outcomeLevel(o Outcome) slog.Level {
	if o == OutcomeExecuted || o == OutcomeDuplicate {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

func outcomeMessage(o Outcome) string {
	switch o {
	case OutcomeExecuted:
		return "inboxmill: handler executed"
	case OutcomeDuplicate:
		return "inboxmill: duplicate acknowledged without running the handler"
	case OutcomeConflict:
		return "inboxmill: key reused with a different payload; refused"
	case OutcomeInFlight:
		return "inboxmill: key held by another delivery; retry later"
	case OutcomeInvalid:
		return "inboxmill: message has no usable idempotency key; refused"
	case OutcomeFailed:
		return "inboxmill: handler failed permanently; recorded, will not run again"
	case OutcomePending:
		return "inboxmill: outcome uncertain; pending until reconciled"
	default:
		return "inboxmill: delivery failed and was rolled back or released for retry"
	}
}

// repeatMessage is the Info line of a key that keeps coming back with
// outcome o, once per RepeatLogInterval.
func repeatMessage(o Outcome) string {
	switch o {
	case OutcomeConflict, OutcomeInvalid:
		return "inboxmill: a refused message keeps being redelivered; it can never succeed — " +
			"route such messages to a poison queue (middleware.PoisonQueueWithFilter with dedup.IsPoison)"
	case OutcomeInFlight, OutcomePending:
		return "inboxmill: a key keeps being redelivered while it is held or pending"
	default:
		return "inboxmill: a key keeps failing on every redelivery"
	}
}

// finish counts, measures and logs the delivery's outcome.
func (d *Deduplicator) finish(msg *message.Message, id identity, o Outcome, err error) {
	d.stats.add(o)
	d.metrics.observe(id.Operation, o)
	level := outcomeLevel(o)
	if !d.log.enabled(level) {
		return // no fields map to build for a line nobody keeps
	}
	var seen repeat
	if level >= slog.LevelInfo && d.repeats != nil {
		seen = d.repeats.seen(repeatKey{operation: id.Operation, id: repeatID(msg, id), outcome: o}, time.Now())
		if !seen.info {
			if level = slog.LevelDebug; !d.log.enabled(level) {
				return
			}
		}
	}
	fields := d.logFields(msg, id, o, err)
	text := outcomeMessage(o)
	switch {
	case o != OutcomeInvalid:
	case errors.Is(err, ErrBeyondRetention):
		text = "inboxmill: event older than the inbox keeps records, and no record of it is left; refused"
	case errors.Is(err, ErrInvalidEventTime):
		text = "inboxmill: message has no usable event time; refused"
	}
	if seen.total > 1 {
		fields["repeats"] = seen.total
		if seen.info {
			fields["suppressed"] = seen.suppressed
			text = repeatMessage(o)
		}
	}
	d.log.log(level, text, fields)
}

// repeatID tells a key apart from others of its operation: its digest, or
// for a message refused before it had one, the message's UUID (which a
// redelivery keeps).
func repeatID(msg *message.Message, id identity) string {
	if id.digest != "" {
		return id.digest
	}
	return "uuid:" + msg.UUID
}

// repeats rate-limits the Info lines of keys that keep coming back with
// the same outcome. It remembers at most max keys, evicting the least
// recently seen; a key evicted and seen again is logged as if new. The
// keys are digests: nothing here holds a raw key.
type repeats struct {
	interval time.Duration
	max      int

	mu  sync.Mutex
	m   map[repeatKey]*list.Element // of *repeatEntry
	lru list.List                   // most recently seen first
}

type repeatKey struct {
	operation, id string
	outcome       Outcome
}

type repeatEntry struct {
	key        repeatKey
	logged     time.Time // the last Info line
	last       time.Time // the last delivery
	total      uint64    // deliveries since the first
	suppressed uint64    // deliveries logged at Debug since the last Info line
}

// repeat is how one delivery is logged.
type repeat struct {
	info              bool // at Info; otherwise at Debug
	total, suppressed uint64
}

// newRepeats returns nil (no rate limit) for a negative interval.
func newRepeats(interval time.Duration, maxKeys int) *repeats {
	if interval < 0 {
		return nil
	}
	return &repeats{interval: interval, max: maxKeys, m: map[repeatKey]*list.Element{}}
}

// seen records a delivery of k at now and says how to log it.
func (r *repeats) seen(k repeatKey, now time.Time) repeat {
	r.mu.Lock()
	defer r.mu.Unlock()
	if el, ok := r.m[k]; ok {
		e := el.Value.(*repeatEntry)
		r.lru.MoveToFront(el)
		if now.Sub(e.last) < r.interval {
			e.last = now
			e.total++
			if now.Sub(e.logged) < r.interval {
				e.suppressed++
				return repeat{total: e.total, suppressed: e.suppressed}
			}
			rep := repeat{info: true, total: e.total, suppressed: e.suppressed}
			e.logged, e.suppressed = now, 0
			return rep
		}
		// Quiet for a whole interval: not a loop, start over.
		*e = repeatEntry{key: k, logged: now, last: now, total: 1}
		return repeat{info: true, total: 1}
	}
	if r.lru.Len() >= r.max {
		oldest := r.lru.Back()
		delete(r.m, oldest.Value.(*repeatEntry).key)
		r.lru.Remove(oldest)
	}
	r.m[k] = r.lru.PushFront(&repeatEntry{key: k, logged: now, last: now, total: 1})
	return repeat{info: true, total: 1}
}

// len is how many keys r remembers.
func (r *repeats) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}
