package dsn

import (
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://app:s3cret@db:5432/orders?sslmode=disable", "postgres://app:xxxxx@db:5432/orders?sslmode=disable"},
		{"postgres://postgres@127.0.0.1:5432/test", "postgres://postgres@127.0.0.1:5432/test"},
		{"mysql://app:s3cret@db/orders", "mysql://app:xxxxx@db/orders"},
		{"app:s3cret@tcp(db:3306)/orders?parseTime=true", "app:xxxxx@tcp(db:3306)/orders?parseTime=true"},
		{"app:p@ss@word@tcp(db:3306)/orders", "app:xxxxx@tcp(db:3306)/orders"},
		{"root@tcp(127.0.0.1:3306)/test", "root@tcp(127.0.0.1:3306)/test"},
		{"host=db user=app password=s3cret dbname=orders", "host=db user=app password=xxxxx dbname=orders"},
		{"postgres://app:bad%zz@db/x", "postgres://xxxxx@db/x"},
		{"file:inbox.db?_pragma=busy_timeout(5000)", "file:inbox.db?_pragma=busy_timeout(5000)"},
		{"./inbox.db", "./inbox.db"},
		{"postgres://app@h/db?password=s3cr3t&sslmode=disable", "postgres://app@h/db?password=xxxxx&sslmode=disable"},
		{"postgres://app:pw@h/db?sslmode=disable&PASSWORD=x", "postgres://app:xxxxx@h/db?PASSWORD=xxxxx&sslmode=disable"},
		{"host=127.0.0.1 port=1 user=app password='s3 cr3t' dbname=orders", "host=127.0.0.1 port=1 user=app password=xxxxx dbname=orders"},
		{`host=h password='it\'s secret' dbname=x`, "host=h password=xxxxx dbname=x"},
		{"password=s3cr3t", "password=xxxxx"},
		{"root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC", "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC"},
	} {
		if got := Redact(c.in); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestDialect(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://app@db/orders", "postgres"},
		{"postgresql://app@db/orders", "postgres"},
		{"host=db dbname=orders", "postgres"},
		{"mysql://app@db/orders", "mysql"},
		{"root@tcp(127.0.0.1:3306)/test?parseTime=true", "mysql"},
		{"app:pw@unix(/run/mysqld.sock)/orders", "mysql"},
		{"file:inbox.db?mode=ro", "sqlite"},
		{":memory:", "sqlite"},
		{"inbox.db", "sqlite"},
		{"/var/lib/app/inbox.sqlite3", "sqlite"},
		{"redis://localhost", ""},
		{"orders", ""},
	} {
		if got := Dialect(c.in); got != c.want {
			t.Errorf("Dialect(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestRedactNeverShowsThePassword: whatever the form, the password's text
// is gone.
func TestRedactNeverShowsThePassword(t *testing.T) {
	for _, in := range []string{
		"postgres://app:hunter2secret@db/x",
		"postgres://app@db/x?password=hunter2secret",
		"mysql://app:hunter2secret@db/x",
		"app:hunter2secret@tcp(db)/x",
		"app:hunter2secret@unix(/run/mysqld/mysqld.sock)/x?parseTime=true",
		"user=app password=hunter2secret host=db",
		"user=app password='hunter2secret and more' host=db",
		"postgres://app:hunter2secret@db:bad/x",
	} {
		if got := Redact(in); strings.Contains(got, "hunter2secret") {
			t.Errorf("Redact(%q) = %q still shows the password", in, got)
		}
	}
}
