package inbox

import (
	"bytes"
	"time"
)

// Status is the life-cycle state of a record.
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

// Limits on the identifying columns, in bytes. They are what the MySQL schema
// can index (VARBINARY(255)); the other dialects enforce the same limits so
// that a store can move between databases.
const (
	MaxScopeLen     = 255
	MaxOperationLen = 255
	MaxKeyLen       = 255
)

// Record is one row of the inbox table.
type Record struct {
	Scope     string
	Operation string
	Key       string
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
