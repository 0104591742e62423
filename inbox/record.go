package inbox

import (
	"bytes"
	"time"
)

// Status is the life-cycle state of a record.
//
//	           Reserve ──► processing ──Complete──► completed
//	                        │  ▲  │  └───Fail─────► failed
//	TakeOver (lease expired)┘  │  └───Pend──► pending ──Complete/Fail──► …
//	                Release ───┘              │
//	                (NotHappened) ◄─Release───┘
//
// Transactional claims insert completed (or failed) directly: nobody sees
// the row before the claim's transaction commits.
type Status string

const (
	// StatusProcessing: a worker holds the intent (in reserve/complete mode,
	// under a lease) and its outcome is not known yet.
	StatusProcessing Status = "processing"
	// StatusCompleted: the effect happened; Result holds what to replay.
	StatusCompleted Status = "completed"
	// StatusFailed: the intent failed permanently; it is not retried.
	StatusFailed Status = "failed"
	// StatusPending: an external effect may or may not have happened; the
	// record waits for reconciliation and is never re-executed by redelivery.
	StatusPending Status = "pending"
)

// Valid reports whether s is one of the four statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusProcessing, StatusCompleted, StatusFailed, StatusPending:
		return true
	}
	return false
}

// Finished reports whether s is terminal: completed or failed. Only
// finished records are ever purged.
func (s Status) Finished() bool { return s == StatusCompleted || s == StatusFailed }

// Record is one row of the inbox table.
type Record struct {
	ID
	// PayloadHash is the fingerprint of the payload that claimed the key.
	PayloadHash []byte
	Status      Status
	// Attempt is the fencing token: 1 for the first claim, incremented by
	// every takeover. A write that names an older attempt changes nothing.
	Attempt    int64
	LeaseOwner string
	// LeaseUntil is zero when no lease is held.
	LeaseUntil time.Time
	// Result is the replayable outcome: in transactional mode, the messages
	// the handler produced, encoded by package dedup.
	Result        []byte
	ResourceID    string
	CorrelationID string
	ExternalRef   string
	Error         string
	CreatedAt     time.Time
	UpdatedAt     time.Time
	// ExpiresAt is zero when the record is kept forever.
	ExpiresAt time.Time
}

// SamePayload reports whether hash is the fingerprint this record was
// claimed with.
func (r *Record) SamePayload(hash []byte) bool {
	return bytes.Equal(r.PayloadHash, hash)
}

// LeaseExpired reports whether a processing record may be taken over at
// now: its lease was released or ran out. It is the TakeOver and
// SelectStale statements' "lease_until IS NULL OR lease_until < now",
// compared to the microsecond as the databases keep times, so a caller
// that checks it first and the statement never disagree on a lease
// expiring exactly now: a lease that runs until now is live.
func (r *Record) LeaseExpired(now time.Time) bool {
	return r.Status == StatusProcessing && (r.LeaseUntil.IsZero() || dbTime(r.LeaseUntil).Before(dbTime(now)))
}

// Purgeable reports whether a purge at now may delete the record: it is
// finished and its expires_at is before now. It is the Purge statement's
// "expires_at < now AND status IN ('completed', 'failed')", compared to
// the microsecond as the databases keep times: a record that expires
// exactly now is kept.
func (r *Record) Purgeable(now time.Time) bool {
	return r.Status.Finished() && !r.ExpiresAt.IsZero() && dbTime(r.ExpiresAt).Before(dbTime(now))
}

// Retention is how long the record was set to outlive its claim: the
// retention its claimer chose, 0 for a record kept forever. A record that
// finishes late is kept this long from when it finishes, so that an intent
// pending longer than its retention is not purged (and run again by the
// next redelivery) the moment it is resolved.
func (r *Record) Retention() time.Duration {
	if r.ExpiresAt.IsZero() {
		return 0
	}
	return r.ExpiresAt.Sub(r.CreatedAt)
}
