package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/inbox"
)

// DryRunClass is what replaying a message would do, as predicted by
// [Deduplicator.DryRun].
type DryRunClass string

const (
	// DryRunNew: no record holds the message's key and the message is
	// within the retention window. A replay runs the handler.
	DryRunNew DryRunClass = "new"
	// DryRunDuplicate: a record holds the key with the same payload
	// fingerprint. A replay does not run the handler for it: a completed or
	// failed record is acked. In reserve mode the record may also be
	// processing or pending (see DryRunResult.Record, DryRunReport.Unfinished):
	// a replay then waits and nacks like any redelivery, and takes over a
	// processing record whose lease expired.
	DryRunDuplicate DryRunClass = "duplicate"
	// DryRunConflict: a record holds the key with another fingerprint. A
	// replay refuses the message with ErrPayloadConflict.
	DryRunConflict DryRunClass = "conflict"
	// DryRunInvalid: no usable key or scope, or the payload cannot be
	// fingerprinted. A replay refuses the message (ErrMissingKey,
	// ErrInvalidKey, ErrFingerprint).
	DryRunInvalid DryRunClass = "invalid"
	// DryRunExpired: the message is older than the retention window. Either
	// no record holds its key and the message was published more than
	// Config.Retention ago (its record was most likely purged), or the
	// record is completed or failed and past its expires_at, so the next
	// purge deletes it. A replay may run the handler again: the
	// exactly-once promise no longer covers the message.
	DryRunExpired DryRunClass = "expired"
)

// DryRunResult is the prediction for one message.
type DryRunResult struct {
	// Class is what a replay would do with the message on its own.
	Class DryRunClass
	// Scope, Operation and Key identify the intent; Key is empty when it
	// could not be derived (DryRunInvalid).
	Scope, Operation, Key string
	// KeyDigest identifies the intent in logs without revealing the key
	// (inbox.KeyDigest); empty when the key could not be derived.
	KeyDigest string
	// PayloadHash is the message's payload fingerprint; nil for
	// DryRunInvalid.
	PayloadHash []byte
	// Record is the record holding the key, nil when there is none.
	Record *inbox.Record
	// Err says why the message is DryRunInvalid (a *KeyError or an error
	// wrapping ErrInvalidKey, ErrFingerprint, ErrInvalidEventTime or, for a
	// partitioned store, ErrBeyondRetention) or DryRunConflict (an
	// *inbox.ConflictError); nil otherwise.
	Err error
}

// DryRun predicts what the middleware would do with msg if it were delivered
// now, using the same key, scope, operation and fingerprint configuration. It
// only reads: it claims nothing, writes nothing, runs no handler, and counts
// nothing in Stats or the metrics.
//
// published is when the message was published (a Kafka record's timestamp);
// when no record holds the key, a message published more than
// Config.Retention ago is DryRunExpired rather than DryRunNew. The zero time
// means unknown: such a message is DryRunNew.
//
// The operation is Config.Operation or, when that is empty, the handler name
// in the message's context; with neither, DryRun returns an error wrapping
// ErrInvalidConfig. Errors are reserved for that and for database failures;
// a message the middleware would refuse is a result (DryRunInvalid,
// DryRunConflict), not an error.
func (d *Deduplicator) DryRun(ctx context.Context, msg *message.Message, published time.Time) (DryRunResult, error) {
	id, err := d.identify(msg)
	if id.Operation == "" {
		return DryRunResult{}, fmt.Errorf("%w: a dry run needs Config.Operation (the router handler's name) "+
			"or a handler name in the message's context", ErrInvalidConfig)
	}
	res := DryRunResult{Operation: id.Operation}
	if err != nil {
		res.Class, res.Err = DryRunInvalid, err
		return res, nil
	}
	res.Scope, res.Key, res.KeyDigest, res.PayloadHash = id.Scope, id.Key, id.digest, id.hash

	rec, err := d.store.Get(ctx, d.store.DB(), id.ID)
	if errors.Is(err, inbox.ErrNotFound) {
		if closed, ok := d.bucketClosed(id.eventTime); ok {
			// A partitioned inbox refuses it: it cannot tell whether it ran.
			res.Class = DryRunInvalid
			res.Err = fmt.Errorf("%w: its event time %s is in a bucket that closed at %s", ErrBeyondRetention,
				id.eventTime.UTC().Format(time.RFC3339), closed.Format(time.RFC3339))
			return res, nil
		}
		res.Class = DryRunNew
		if d.beforeRetention(published) {
			res.Class = DryRunExpired
		}
		return res, nil
	}
	if err != nil {
		return DryRunResult{}, fmt.Errorf("dedup: dry run: %w", err)
	}
	res.Record = rec
	switch {
	case !rec.SamePayload(id.hash):
		// A conflict outranks expiry: while the record exists, a replay
		// refuses the message, and the reuse of the key is worth knowing.
		res.Class = DryRunConflict
		res.Err = &inbox.ConflictError{ID: id.ID, Existing: rec}
	case rec.Purgeable(d.store.Now()):
		res.Class = DryRunExpired
	default:
		res.Class = DryRunDuplicate
	}
	return res, nil
}

// bucketClosed reports whether, in a partitioned store, the bucket of an
// event of time t has closed (and when): the store then refuses a claim of
// it that finds no record.
func (d *Deduplicator) bucketClosed(t time.Time) (time.Time, bool) {
	p, ok := d.store.Partitioning()
	if !ok || t.IsZero() {
		return time.Time{}, false
	}
	closes := p.Closes(p.Bucket(t))
	return closes, !closes.After(d.store.Now())
}

// beforeRetention reports whether a message published at t is older than
// the retention window.
func (d *Deduplicator) beforeRetention(t time.Time) bool {
	if t.IsZero() || d.cfg.Retention < 0 {
		return false
	}
	return t.Before(d.store.Now().Add(-d.cfg.Retention))
}

// DryRunReport adds up the predictions for a range of messages, such as a
// Kafka topic about to be replayed. The zero value is ready to use; it is
// not safe for concurrent use.
//
// It predicts the replay of the whole range, not of each message alone: the
// first message of a key that a replay would run (DryRunNew or
// DryRunExpired) claims it, so later messages of that key in the range count
// as duplicates (same fingerprint) or conflicts (another one). For that it
// remembers those keys' digests and fingerprints, about 100 bytes each.
type DryRunReport struct {
	// Messages is how many results were added.
	Messages int64
	// New, Duplicate, Conflict, Invalid and Expired count the messages by
	// the class Add returned.
	New, Duplicate, Conflict, Invalid, Expired int64
	// Unfinished counts the duplicates whose record is still processing or
	// pending (reserve mode): a replay nacks them until the intent is
	// finished, or takes over one whose lease expired.
	Unfinished int64

	claimed map[string][]byte // key digest → fingerprint, of keys a replay would run
}

// Add counts res and returns its class within the range (see
// [DryRunReport]), which differs from res.Class for a later message of a key
// that an earlier message in the range claims.
func (r *DryRunReport) Add(res DryRunResult) DryRunClass {
	class := res.Class
	if class == DryRunNew || class == DryRunExpired {
		if hash, ok := r.claimed[res.KeyDigest]; ok {
			class = DryRunDuplicate
			if string(hash) != string(res.PayloadHash) {
				class = DryRunConflict
			}
		} else {
			if r.claimed == nil {
				r.claimed = make(map[string][]byte)
			}
			r.claimed[res.KeyDigest] = res.PayloadHash
		}
	}
	r.Messages++
	switch class {
	case DryRunNew:
		r.New++
	case DryRunDuplicate:
		r.Duplicate++
		if res.Record != nil && (res.Record.Status == inbox.StatusProcessing || res.Record.Status == inbox.StatusPending) {
			r.Unfinished++
		}
	case DryRunConflict:
		r.Conflict++
	case DryRunInvalid:
		r.Invalid++
	case DryRunExpired:
		r.Expired++
	}
	return class
}

// WouldExecute is how many messages of the range a replay would run the
// handler for: the new and the expired ones.
func (r *DryRunReport) WouldExecute() int64 { return r.New + r.Expired }

// String renders the counts as one line of key=value pairs.
func (r *DryRunReport) String() string {
	s := fmt.Sprintf("messages=%d new=%d duplicate=%d conflict=%d invalid=%d expired=%d",
		r.Messages, r.New, r.Duplicate, r.Conflict, r.Invalid, r.Expired)
	if r.Unfinished > 0 {
		s += fmt.Sprintf(" unfinished=%d", r.Unfinished)
	}
	return s
}
