package inbox

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// TestUnusableStmt pins which errors of a prepared statement send the store
// back to the SQL text. A MySQL server at max_prepared_stmt_count cannot be
// staged in a shared test database (every parameterized query of every
// other test would fail), so the refusal is checked here, by its error.
func TestUnusableStmt(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("sql: statement is closed"), true},
		{&mysql.MySQLError{Number: 1461, Message: "Can't create more than max_prepared_stmt_count statements"}, true},
		{fmt.Errorf("wrapped: %w", &mysql.MySQLError{Number: 1461}), true},
		{&mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}, false},
		{errors.New("sql: Tx.Stmt: statement from different database used"), false},
		{errors.New("connection refused"), false},
	} {
		if got := unusableStmt(tc.err); got != tc.want {
			t.Errorf("unusableStmt(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
