// Package dsn handles the data source names the commands and examples take:
// it redacts their passwords for printing and tells which database a DSN
// is for.
package dsn

import (
	"net/url"
	"strings"
)

// Redact returns dsn with its password replaced by "xxxxx", for logs and
// error messages. It knows the URL form (postgres://user:pass@host/db,
// mysql://...), the MySQL driver's form (user:pass@tcp(host)/db) and the
// key=value form (host=... password=...). A DSN it cannot parse is
// returned with everything before its last "@" hidden, since that is
// where a password would be.
func Redact(dsn string) string {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err == nil {
			return u.Redacted()
		}
		return hideUserinfo(dsn)
	}
	if kv, ok := redactKeyValue(dsn); ok {
		return kv
	}
	if at := strings.LastIndex(dsn, "@"); at >= 0 {
		// user:pass@tcp(host)/db — the MySQL driver's form.
		cred := dsn[:at]
		if i := strings.Index(cred, ":"); i >= 0 {
			return cred[:i] + ":xxxxx" + dsn[at:]
		}
		return dsn
	}
	return dsn
}

func hideUserinfo(dsn string) string {
	scheme, rest, _ := strings.Cut(dsn, "://")
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		return scheme + "://xxxxx" + rest[at:]
	}
	return dsn
}

// redactKeyValue handles libpq's "host=h user=u password=p" form.
func redactKeyValue(dsn string) (string, bool) {
	if !strings.Contains(dsn, "=") || strings.Contains(dsn, "@") && !strings.Contains(dsn, " ") {
		return "", false
	}
	fields := strings.Fields(dsn)
	found := false
	for i, f := range fields {
		k, _, ok := strings.Cut(f, "=")
		if !ok {
			return "", false
		}
		if strings.EqualFold(k, "password") {
			fields[i] = k + "=xxxxx"
			found = true
		}
	}
	if !found && !strings.Contains(dsn, " ") {
		return "", false
	}
	return strings.Join(fields, " "), true
}

// Dialect returns the dialect a DSN is written for: "postgres" for
// postgres:// and postgresql:// URLs and libpq key=value strings, "mysql"
// for mysql:// URLs and the MySQL driver's user@tcp(host)/db form,
// "sqlite" for file: URLs, ":memory:" and paths. It returns "" when it
// cannot tell.
func Dialect(dsn string) string {
	lower := strings.ToLower(dsn)
	switch {
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		return "postgres"
	case strings.HasPrefix(lower, "mysql://"):
		return "mysql"
	case strings.HasPrefix(lower, "file:"), strings.HasPrefix(lower, "sqlite://"), lower == ":memory:":
		return "sqlite"
	case strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix(") || strings.HasPrefix(dsn, "tcp("):
		return "mysql"
	case strings.Contains(dsn, "://"):
		return ""
	case strings.Contains(dsn, "host=") || strings.Contains(dsn, "dbname="):
		return "postgres"
	case strings.HasSuffix(lower, ".db"), strings.HasSuffix(lower, ".sqlite"), strings.HasSuffix(lower, ".sqlite3"),
		strings.HasPrefix(dsn, "/"), strings.HasPrefix(dsn, "./"), strings.HasPrefix(dsn, "../"):
		return "sqlite"
	}
	return ""
}
