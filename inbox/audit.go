package inbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The actions the audit table records.
const (
	// ActionResolve: [Store.Resolve] settled a record.
	ActionResolve = "resolve"
	// ActionForget: [Store.Forget] deleted a record.
	ActionForget = "forget"
	// ActionPurge: a [Store.Purge] run with PurgeParams.Audit deleted
	// expired records; one entry per run.
	ActionPurge = "purge"
)

// AuditEntry is one operator action, recorded in "<table>_audit" in the
// transaction that made the change: an entry exists exactly when its
// change committed. The store never deletes entries (MigrateDown to 0
// drops the table with the inbox).
type AuditEntry struct {
	// ID identifies the entry: 24 lowercase hex characters, the first 16
	// of which are the entry's time in microseconds, so that IDs sort in
	// time order.
	ID string
	// At is when the action was taken, by the store's clock (for a purge:
	// its first batch).
	At time.Time
	// Actor is Actor.Name of the action.
	Actor string
	// Action is ActionResolve, ActionForget or ActionPurge.
	Action string
	// Record is the record acted on; zero for a purge.
	Record ID
	// StatusBefore and AttemptBefore are the record's status and attempt
	// before the action; "" and 0 for a purge.
	StatusBefore  Status
	AttemptBefore int64
	// StatusAfter is the status the action moved the record to; "" for
	// forget and purge.
	StatusAfter Status
	// Reason is Actor.Reason of the action.
	Reason string
	// Before is a JSON object holding the record as it was before the
	// action: every column, with result replaced by result_bytes (its
	// length) and payload_hash in hex; "" for a purge.
	Before string
	// Count is how many records the action affected: 1, or for a purge
	// the records its committed batches deleted.
	Count int64
}

// AuditFilter selects the entries [Store.ListAudit] returns. The zero
// value selects every entry.
type AuditFilter struct {
	// Record, when set, keeps only the entries of that record.
	Record *ID
	// Action, when not empty, keeps only entries of that action
	// (ActionResolve, ActionForget or ActionPurge).
	Action string
	// After is the cursor of the page to read: the next value the
	// previous page returned. Entries older than it follow. "" starts at
	// the newest.
	After string
	// Limit is the page size. Defaults to DefaultListLimit; a limit above
	// MaxListLimit reads MaxListLimit entries.
	Limit int
}

// ListAudit returns audit entries, newest first, one page at a time, and
// the cursor of the next page (AuditFilter.After; "" when there are no
// more). A record's entries and an action's entries are read by index.
// Invalid filters are refused with [ErrInvalidParams].
func (s *Store) ListAudit(ctx context.Context, f AuditFilter) ([]AuditEntry, string, error) {
	limit, err := pageLimit(f.Limit)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	p := &params{limit: limit + 1}
	if f.Record != nil {
		if err := f.Record.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("record %w", err))
		}
		p.id = *f.Record
	}
	switch f.Action {
	case "", ActionResolve, ActionForget, ActionPurge:
		p.audit.action = f.Action
	default:
		errs = append(errs, fmt.Errorf("action %q is not %s, %s or %s", f.Action, ActionResolve, ActionForget, ActionPurge))
	}
	if f.After != "" && !isLowerHex(f.After, auditIDLen) {
		errs = append(errs, errors.New("the cursor is not one a listing returned"))
	}
	p.audit.id = f.After
	if err := invalidParams("list audit", errs); err != nil {
		return nil, "", err
	}
	rows, err := s.query(ctx, s.db, s.q.listAudit, p)
	if err != nil {
		return nil, "", fmt.Errorf("inbox: list audit: %w", s.Classify(err))
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var (
			e                                AuditEntry
			statusBefore, statusAfter, jsonS sql.NullString
		)
		if err := rows.Scan(&e.ID, timeCol{&e.At}, &e.Actor, &e.Action, &e.Record.Scope, &e.Record.Operation,
			&e.Record.Key, &statusBefore, &e.AttemptBefore, &statusAfter, &e.Reason, &jsonS, &e.Count); err != nil {
			return nil, "", fmt.Errorf("inbox: list audit: %w", err)
		}
		e.StatusBefore, e.StatusAfter, e.Before = Status(statusBefore.String), Status(statusAfter.String), jsonS.String
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("inbox: list audit: %w", s.Classify(err))
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		next = out[limit-1].ID
	}
	return out, next, nil
}

// auditIDLen is the length of an audit entry's ID.
const auditIDLen = 24

// newAuditID returns a new audit entry ID for an action at now: the time
// in microseconds as 16 hex digits, then 8 random ones, so that IDs sort
// in time order and two entries of one microsecond do not collide.
func newAuditID(now time.Time) string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%016x%s", uint64(now.UnixMicro()), hex.EncodeToString(r[:]))
}

// recordSnapshot is the JSON form of a record in AuditEntry.Before.
type recordSnapshot struct {
	Scope         string     `json:"scope"`
	Operation     string     `json:"operation"`
	Key           string     `json:"key"`
	PayloadHash   string     `json:"payload_hash"`
	Status        Status     `json:"status"`
	Attempt       int64      `json:"attempt"`
	LeaseOwner    string     `json:"lease_owner"`
	LeaseUntil    *time.Time `json:"lease_until"`
	ResultBytes   int        `json:"result_bytes"`
	ResourceID    string     `json:"resource_id"`
	CorrelationID string     `json:"correlation_id"`
	ExternalRef   string     `json:"external_ref"`
	Error         string     `json:"error"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	ExpiresAt     *time.Time `json:"expires_at"`
}

// recordJSON is rec as AuditEntry.Before holds it.
func recordJSON(rec *Record) (string, error) {
	opt := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	err := enc.Encode(recordSnapshot{
		Scope: rec.Scope, Operation: rec.Operation, Key: rec.Key, PayloadHash: hex.EncodeToString(rec.PayloadHash),
		Status: rec.Status, Attempt: rec.Attempt, LeaseOwner: rec.LeaseOwner, LeaseUntil: opt(rec.LeaseUntil),
		ResultBytes: len(rec.Result), ResourceID: rec.ResourceID, CorrelationID: rec.CorrelationID,
		ExternalRef: rec.ExternalRef, Error: rec.Error, CreatedAt: rec.CreatedAt.UTC(), UpdatedAt: rec.UpdatedAt.UTC(),
		ExpiresAt: opt(rec.ExpiresAt),
	})
	if err != nil {
		return "", fmt.Errorf("snapshot of the record: %w", err)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}
