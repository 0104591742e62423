package inbox

import "database/sql"

// CloseCachedStatements closes every statement the store prepared but
// leaves them in its cache: what a call racing with Store.Close finds.
func CloseCachedStatements(s *Store) {
	s.stmts.m.Range(func(_, v any) bool {
		_ = v.(*sql.Stmt).Close()
		return true
	})
}
