package horizon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/inboxmill/inboxmill/dedup"
)

// Forever is the Age of a [Horizon] with no bound of time, and the inbox
// retention that keeps records forever (as dedup.Config.Retention).
const Forever time.Duration = -1

// Errors of [Require] and [Report.Err].
var (
	// ErrHorizonExceeded is returned when the inbox forgets a record
	// sooner than the transport forgets its message: a message older than
	// the inbox retention can be delivered again and would run again.
	ErrHorizonExceeded = errors.New("horizon: the inbox forgets sooner than the transport")
	// ErrHorizonUnknown is returned when the transport bounds its
	// messages by something other than time (Kafka's retention.bytes
	// alone), so that no retention can be shown to outlast them.
	ErrHorizonUnknown = errors.New("horizon: the transport's horizon is not a time")
)

// Horizon is how far back a transport can deliver a message again.
type Horizon struct {
	// Name says what was asked, for messages: "topic orders", "table
	// watermill_orders".
	Name string
	// Age is how old a message can be and still be delivered again;
	// [Forever] when nothing bounds it in time. It is never 0 unless the
	// transport keeps nothing that could come again.
	Age time.Duration
	// BySize is set when Age is Forever but the transport drops messages
	// by size (Kafka retention.bytes with retention.ms -1): how far back
	// that reaches depends on the traffic, so the horizon is unknown.
	BySize bool
	// Grace is how much longer than Age a message may stay readable
	// because the transport deletes in bulk: Kafka deletes a whole
	// segment once its newest message is older than retention.ms, so a
	// message can outlive Age by up to segment.ms. The check compares
	// against Age (the configured promise) and mentions Grace when the
	// inbox retention falls inside it.
	Grace time.Duration
	// Oldest is the age of the oldest message the source saw, when it
	// looked (a SQL queue); -1 when it did not look or saw none.
	Oldest time.Duration
	// Note is an explanation the source adds to the report ("rows are
	// never deleted"); "" for none.
	Note string
}

// Unknown reports whether the horizon cannot be stated as a time.
func (h Horizon) Unknown() bool { return h.Age == Forever && h.BySize }

// String describes how long the transport keeps messages, e.g. "topic
// orders keeps messages for 30d".
func (h Horizon) String() string {
	name := h.Name
	if name == "" {
		name = "the transport"
	}
	switch {
	case h.Unknown():
		return name + " keeps messages up to a size, not a time"
	case h.Age == Forever:
		return name + " keeps messages forever"
	default:
		return name + " keeps messages for " + FormatDuration(h.Age)
	}
}

// Source reports the horizon of one transport: a topic, a table.
type Source interface {
	// Horizon reads the transport's settings (and, for some, its oldest
	// message) and says how far back a redelivery or replay can reach.
	Horizon(ctx context.Context) (Horizon, error)
}

// SourceFunc adapts a function to [Source].
type SourceFunc func(ctx context.Context) (Horizon, error)

// Horizon calls f.
func (f SourceFunc) Horizon(ctx context.Context) (Horizon, error) { return f(ctx) }

// Fixed is a Source that reports h: for a transport whose horizon is a
// known figure (a webhook provider's retry window, a queue's fixed
// message TTL).
func Fixed(h Horizon) Source {
	return SourceFunc(func(context.Context) (Horizon, error) { return h, nil })
}

// Report is the outcome of a check.
type Report struct {
	// InboxRetention is the retention checked, after defaults: a positive
	// duration or [Forever].
	InboxRetention time.Duration
	// Horizon is what the source reported.
	Horizon Horizon
	// Safe is set when every message the transport can deliver again is
	// younger than the inbox retention.
	Safe bool
	// Message says so in a sentence, e.g. "the inbox keeps records for 7d
	// but topic orders keeps messages for 30d: messages older than 7d
	// would run again".
	Message string
}

// String returns r.Message.
func (r Report) String() string { return r.Message }

// Err returns nil when r is safe, and otherwise an error wrapping
// [ErrHorizonUnknown] (a horizon bounded by size) or [ErrHorizonExceeded],
// whose text is r.Message.
func (r Report) Err() error {
	switch {
	case r.Safe:
		return nil
	case r.Horizon.Unknown():
		return &reportError{r: r, sentinel: ErrHorizonUnknown}
	default:
		return &reportError{r: r, sentinel: ErrHorizonExceeded}
	}
}

// reportError carries a report that is not safe.
type reportError struct {
	r        Report
	sentinel error
}

func (e *reportError) Error() string { return e.r.Message }
func (e *reportError) Unwrap() error { return e.sentinel }

// Check reads src's horizon and compares it with inboxRetention, which
// takes the values of dedup.Config.Retention: 0 is
// dedup.DefaultRetention, [Forever] (-1) keeps records forever. It returns
// an error only when the source cannot be read or the retention is
// invalid; an unsafe pair is a Report with Safe unset (see [Require] to
// refuse it).
func Check(ctx context.Context, src Source, inboxRetention time.Duration) (Report, error) {
	if src == nil {
		return Report{}, errors.New("horizon: nil Source")
	}
	if inboxRetention == 0 {
		inboxRetention = dedup.DefaultRetention
	}
	if inboxRetention < 0 && inboxRetention != Forever {
		return Report{}, fmt.Errorf("horizon: inbox retention %v is negative (use -1 for forever)", inboxRetention)
	}
	h, err := src.Horizon(ctx)
	if err != nil {
		return Report{}, err
	}
	if h.Age < 0 && h.Age != Forever {
		return Report{}, fmt.Errorf("horizon: %s reported a negative age %v", h.Name, h.Age)
	}
	return Compare(h, inboxRetention), nil
}

// Require is [Check] that refuses: it returns the report and, when the
// pair is not safe, [Report.Err] (wrapping [ErrHorizonExceeded] or
// [ErrHorizonUnknown]). It is the strict setting for a service that must
// not start with an inbox that forgets sooner than its transport.
func Require(ctx context.Context, src Source, inboxRetention time.Duration) (Report, error) {
	r, err := Check(ctx, src, inboxRetention)
	if err != nil {
		return r, err
	}
	return r, r.Err()
}

// Compare is the comparison of [Check] without the reading: inboxRetention
// is a positive duration or [Forever] (no defaults are applied).
func Compare(h Horizon, inboxRetention time.Duration) Report {
	r := Report{InboxRetention: inboxRetention, Horizon: h}
	keeps := "the inbox keeps records for " + FormatDuration(inboxRetention)
	if inboxRetention == Forever {
		keeps = "the inbox keeps records forever"
	}
	note := ""
	if h.Note != "" {
		note = " (" + h.Note + ")"
	}
	switch {
	case inboxRetention == Forever:
		r.Safe = true
		r.Message = keeps + " and " + h.String() + note + ": every message that can come again is recognised"
	case h.Unknown():
		r.Message = keeps + " but " + h.String() + note + ": how old a message can be depends on the traffic; " +
			"messages older than " + FormatDuration(inboxRetention) + " would run again"
	case h.Age == Forever:
		r.Message = keeps + " but " + h.String() + note + ": messages older than " +
			FormatDuration(inboxRetention) + " would run again"
	case inboxRetention < h.Age:
		r.Message = keeps + " but " + h.String() + note + ": messages older than " +
			FormatDuration(inboxRetention) + " would run again"
	default:
		r.Safe = true
		r.Message = keeps + " and " + h.String() + note + ": every message that can come again is recognised"
		if h.Grace > 0 && inboxRetention < h.Age+h.Grace {
			r.Message += "; a message may stay readable up to " + FormatDuration(h.Grace) +
				" longer (whole segments are deleted), so a retention of " + FormatDuration(h.Age+h.Grace) +
				" leaves no gap"
		}
	}
	return r
}

// FormatDuration writes d the way retention is thought of: whole days as
// "7d", a day or more with a rest as "1d12h" or "3d4h5m", less than a day
// as time.Duration does without zero units ("36m", "1.5s"); "forever" for
// [Forever].
func FormatDuration(d time.Duration) string {
	const day = 24 * time.Hour
	if d == Forever {
		return "forever"
	}
	if d <= 0 {
		return d.String()
	}
	out := ""
	if d >= day {
		out = fmt.Sprintf("%dd", d/day)
		d %= day
		if d == 0 {
			return out
		}
	}
	rest := d.String()
	// Drop zero units at the end: "4h0m0s" is "4h", "5m0s" is "5m".
	for _, zero := range []string{"0s", "0m"} {
		if r, ok := strings.CutSuffix(rest, zero); ok && r != "" && !strings.HasSuffix(r, ".") && isUnit(r[len(r)-1]) {
			rest = r
		}
	}
	return out + rest
}

func isUnit(c byte) bool { return c == 'h' || c == 'm' || c == 's' }
