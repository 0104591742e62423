package inbox

import (
	"errors"
	"fmt"
	"testing"
)

// refusingDialect classifies errRefused as the server refusing to prepare
// a statement, as the MySQL dialect does with error 1461. (That dialect
// cannot be imported here: it imports this package. Its own mapping, and
// the fallback through it, are checked in prepare_refused_test.go.)
type refusingDialect struct{ Dialect }

var errRefused = errors.New("Can't create more than max_prepared_stmt_count statements")

func (refusingDialect) Classify(err error) error {
	if errors.Is(err, errRefused) {
		return PrepareRefused(err)
	}
	return err
}

// TestUnusableStmt pins which errors of a prepared statement send the store
// back to the SQL text: those that mean the statement did not run.
func TestUnusableStmt(t *testing.T) {
	s := &Store{dialect: refusingDialect{}}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("sql: statement is closed"), true},
		{errRefused, true},
		{fmt.Errorf("wrapped: %w", errRefused), true},
		{errors.New("Duplicate entry"), false},
		{errors.New("sql: Tx.Stmt: statement from different database used"), false},
		{errors.New("connection refused"), false},
	} {
		if got := s.unusableStmt(tc.err); got != tc.want {
			t.Errorf("unusableStmt(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
