package inbox

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound: no record has that (scope, operation, key).
	ErrNotFound = errors.New("inbox: record not found")

	// ErrPayloadConflict: the key was claimed with a different payload
	// fingerprint. The key was reused for another intent; the new payload
	// must not be processed, nor acknowledged as a duplicate.
	ErrPayloadConflict = errors.New("inbox: key reused with a different payload")

	// ErrLeaseLost: the record's attempt is no longer the caller's (another
	// worker took it over, or it was finished); nothing was changed.
	ErrLeaseLost = errors.New("inbox: attempt no longer holds the record")

	// ErrInvalidKey: a scope, operation or key is empty where it may not be,
	// longer than its limit, not valid UTF-8 or contains a NUL byte.
	ErrInvalidKey = errors.New("inbox: invalid key")

	// ErrBeyondRetention: in a partitioned table, the event's bucket has
	// closed (see [Partitioning]): its record, if it ever had one, may
	// have been dropped, so the store can no longer tell a duplicate from
	// a first delivery. Nothing was claimed; the delivery must not run
	// (route it to a poison queue: no retry changes the answer).
	ErrBeyondRetention = errors.New("inbox: the event is older than the inbox keeps records")

	// ErrInvalidConfig: the store's configuration is unusable.
	ErrInvalidConfig = errors.New("inbox: invalid config")

	// ErrTransient marks database errors after which retrying the whole
	// transaction may succeed: serialization failures, deadlocks, lock
	// timeouts, a busy SQLite database, a lost connection. The driver's own
	// error stays in the chain.
	ErrTransient = errors.New("inbox: transient database error")

	// ErrPrepareRefused marks a database's refusal to prepare a statement
	// (MySQL's max_prepared_stmt_count); the store then sends SQL text.
	ErrPrepareRefused = errors.New("inbox: the database refused to prepare a statement")

	// ErrIllegalTransition: the caller asked for a move the record's
	// life-cycle does not have (completing a record through a handle it
	// is not held by, extending the lease of a pending record, ...).
	ErrIllegalTransition = errors.New("inbox: illegal record transition")

	// ErrSchemaOutdated: the inbox table's schema is older than this code
	// (migrations are missing), or the table does not exist. Run
	// Store.Migrate.
	ErrSchemaOutdated = errors.New("inbox: schema is older than the code; run the migrations")

	// ErrSchemaNewer: the database has schema versions this code does not
	// know; it was migrated by a newer release.
	ErrSchemaNewer = errors.New("inbox: schema is newer than the code")

	// ErrTableMissing: a table the applied schema versions created does
	// not exist; it was dropped (or renamed) outside the migrations. The
	// versions are still recorded, so running the migrations again does
	// not bring it back: restore it, or drop "<table>_migrations" and run
	// them again, which creates what is missing (every migration can run
	// over a schema it was applied to).
	ErrTableMissing = errors.New("inbox: a table of the schema does not exist although its version is recorded")
)

// Transient wraps err with [ErrTransient] (once). Dialects use it in
// Classify.
func Transient(err error) error {
	if err == nil || errors.Is(err, ErrTransient) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrTransient, err)
}

// PrepareRefused wraps err with [ErrPrepareRefused]. Dialects use it in
// Classify.
func PrepareRefused(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPrepareRefused, err)
}

// IsRetryable reports whether err is worth retrying from a clean start (a new
// transaction, or a redelivery of the message).
func IsRetryable(err error) bool {
	return errors.Is(err, ErrTransient)
}

// ConflictError carries the context of an [ErrPayloadConflict].
type ConflictError struct {
	// ID is the intent's identity. Error() prints only its digest.
	ID ID
	// Existing is the record that holds the key.
	Existing *Record
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("inbox: key %s of operation %q in scope %q was claimed with a different payload",
		e.ID.Digest(), e.ID.Operation, e.ID.Scope)
}

// Unwrap makes errors.Is(err, ErrPayloadConflict) true.
func (e *ConflictError) Unwrap() error { return ErrPayloadConflict }

// ErrTxAborted: a savepoint statement failed in the caller's transaction,
// which means the database ended it; nothing more may be written through
// it (see [Store.WithSavepoint]).
var ErrTxAborted = errors.New("inbox: the transaction was aborted")

var (
	// ErrLeaseLive: the record is processing under a lease that has not
	// run out; an operator action never touches it (its worker may still
	// complete it). Wait for the lease to expire, or for the worker.
	ErrLeaseLive = errors.New("inbox: the record is processing under a live lease")

	// ErrNotResolvable: the record's status does not allow the operator
	// action asked for, such as resolving a record that is already
	// completed or failed.
	ErrNotResolvable = errors.New("inbox: the record's status does not allow this")

	// ErrInvalidParams: the parameters of an operator action are unusable
	// (a missing actor or reason, text that is not storable, a target
	// status that is not completed or failed, a malformed cursor). Nothing
	// was sent to the database.
	ErrInvalidParams = errors.New("inbox: invalid parameters")
)
