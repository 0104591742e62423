package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
)

// outputFlag is --output: table for people, json for scripts.
type outputFlag string

func (o *outputFlag) String() string { return string(*o) }
func (o *outputFlag) Type() string   { return "table|json" }
func (o *outputFlag) Set(v string) error {
	switch v {
	case "table", "json":
		*o = outputFlag(v)
		return nil
	}
	return fmt.Errorf("%q: want table or json", v)
}

func addOutputFlag(cmd *cobra.Command, o *outputFlag) {
	*o = "table"
	cmd.Flags().VarP(o, "output", "o", "table (for people) or json (for scripts)")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// text renders a value an operator's terminal shows: as it is when every
// character is printable, quoted (with escapes) otherwise, so that a key
// holding control characters or terminal escapes cannot rewrite the
// screen, and an empty value reads as "". Bytes that are not UTF-8 are
// escaped too (a row written around the store can hold them): 0x9b, raw,
// starts a control sequence on a terminal that reads Latin-1.
func text(s string) string {
	if s == "" {
		return `""`
	}
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || r == '\t' {
			return strconv.Quote(s)
		}
	}
	if strings.TrimSpace(s) != s || strings.HasPrefix(s, `"`) {
		return strconv.Quote(s)
	}
	return s
}

// optional renders an optional column: "-" when empty.
func optional(s string) string {
	if s == "" {
		return "-"
	}
	return text(s)
}

// age renders how long before now t was, "3m12s".
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return roundDuration(now.Sub(t)).String()
}

// roundDuration keeps a duration readable: seconds for anything above a
// minute, milliseconds below.
func roundDuration(d time.Duration) time.Duration {
	switch a := d.Abs(); {
	case a >= time.Minute:
		return d.Round(time.Second)
	case a >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// leaseState renders a record's lease at now.
func leaseState(r *inbox.Record, now time.Time) string {
	switch {
	case r.Status != inbox.StatusProcessing && r.LeaseOwner == "" && r.LeaseUntil.IsZero():
		return "-"
	case r.LeaseUntil.IsZero():
		return "released"
	case r.LeaseExpired(now):
		return "expired " + roundDuration(now.Sub(r.LeaseUntil)).String() + " ago"
	}
	return "live, " + roundDuration(r.LeaseUntil.Sub(now)).String() + " left"
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// recordJSON is a record as the json output shows it. Times are RFC 3339
// in UTC, absent ones null.
type recordJSON struct {
	Scope         string     `json:"scope"`
	Operation     string     `json:"operation"`
	Key           string     `json:"key"`
	Digest        string     `json:"digest"`
	Status        string     `json:"status"`
	Attempt       int64      `json:"attempt"`
	PayloadHash   string     `json:"payload_hash"`
	LeaseOwner    string     `json:"lease_owner,omitempty"`
	LeaseUntil    *time.Time `json:"lease_until"`
	LeaseLive     bool       `json:"lease_live"`
	ResultBytes   int        `json:"result_bytes"`
	ResourceID    string     `json:"resource_id,omitempty"`
	CorrelationID string     `json:"correlation_id,omitempty"`
	ExternalRef   string     `json:"external_ref,omitempty"`
	Error         string     `json:"error,omitempty"`
	CreatedAt     *time.Time `json:"created_at"`
	UpdatedAt     *time.Time `json:"updated_at"`
	ExpiresAt     *time.Time `json:"expires_at"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func toJSON(r *inbox.Record, now time.Time) recordJSON {
	return recordJSON{
		Scope: r.Scope, Operation: r.Operation, Key: r.Key, Digest: r.Digest(),
		Status: string(r.Status), Attempt: r.Attempt, PayloadHash: hex.EncodeToString(r.PayloadHash),
		LeaseOwner: r.LeaseOwner, LeaseUntil: timePtr(r.LeaseUntil),
		LeaseLive:   r.Status == inbox.StatusProcessing && !r.LeaseUntil.IsZero() && !r.LeaseExpired(now),
		ResultBytes: len(r.Result), ResourceID: r.ResourceID, CorrelationID: r.CorrelationID,
		ExternalRef: r.ExternalRef, Error: r.Error,
		CreatedAt: timePtr(r.CreatedAt), UpdatedAt: timePtr(r.UpdatedAt), ExpiresAt: timePtr(r.ExpiresAt),
	}
}
