// Package dsn handles the data source names the commands and examples take:
// it redacts their passwords for printing and tells which database a DSN
// is for.
package dsn

import (
	"net/url"
	"strings"
)

// hidden replaces a password.
const hidden = "xxxxx"

// Redact returns dsn with its password replaced by "xxxxx", for logs and
// error messages. It knows the URL form (postgres://user:pass@host/db,
// mysql://..., with a password in the userinfo or in a password= query
// parameter), the MySQL driver's form (user:pass@tcp(host)/db) and libpq's
// key=value form (host=... password=... or password='quoted value'). A URL
// it cannot parse is returned with everything between the scheme and the
// last "@" hidden, since that is where a password would be.
func Redact(dsn string) string {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return hideUserinfo(dsn)
		}
		if q := u.Query(); hasPassword(q) {
			for k := range q {
				if isPasswordKey(k) {
					q[k] = []string{hidden}
				}
			}
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	if kv, ok := redactKeyValue(dsn); ok {
		return kv
	}
	if at := strings.LastIndex(dsn, "@"); at >= 0 {
		// user:pass@tcp(host)/db — the MySQL driver's form.
		cred := dsn[:at]
		if i := strings.Index(cred, ":"); i >= 0 {
			return cred[:i] + ":" + hidden + dsn[at:]
		}
		return dsn
	}
	return dsn
}

func isPasswordKey(k string) bool {
	return strings.EqualFold(k, "password") || strings.EqualFold(k, "passwd") || strings.EqualFold(k, "pass")
}

func hasPassword(q url.Values) bool {
	for k := range q {
		if isPasswordKey(k) {
			return true
		}
	}
	return false
}

func hideUserinfo(dsn string) string {
	scheme, rest, _ := strings.Cut(dsn, "://")
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		return scheme + "://" + hidden + rest[at:]
	}
	return dsn
}

// redactKeyValue handles libpq's "host=h user=u password=p" form, whose
// values may be single-quoted with backslash escapes ('s3 cr\'t'). It
// reports false for a string that is not in that form.
func redactKeyValue(dsn string) (string, bool) {
	s := strings.TrimSpace(dsn)
	if s == "" || !strings.Contains(s, "=") {
		return "", false
	}
	var (
		out   strings.Builder
		found bool
	)
	for i := 0; i < len(s); {
		for i < len(s) && s[i] == ' ' {
			i++
		}
		if i == len(s) {
			break
		}
		start := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' {
			i++
		}
		if i == len(s) || s[i] != '=' || i == start {
			return "", false
		}
		key := s[start:i]
		i++ // '='
		vstart := i
		if i < len(s) && s[i] == '\'' {
			i++
			for i < len(s) && s[i] != '\'' {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(s) {
				return "", false // unterminated quote
			}
			i++
		} else {
			for i < len(s) && s[i] != ' ' {
				i++
			}
		}
		if out.Len() > 0 {
			out.WriteByte(' ')
		}
		out.WriteString(key)
		out.WriteByte('=')
		if isPasswordKey(key) {
			out.WriteString(hidden)
			found = true
		} else {
			out.WriteString(s[vstart:i])
		}
	}
	if !found && !strings.Contains(s, " ") {
		// One key=value pair without a password: more likely a path or a
		// MySQL DSN with a query than a libpq string.
		return "", false
	}
	return out.String(), true
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
