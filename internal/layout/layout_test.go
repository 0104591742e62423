package layout_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/inboxmill/inboxmill"

// pkg is what `go list -json` says of a package.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func list(t *testing.T, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = "../.."
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(&out)
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, module), "/") }

// floor is a package's height in the house: a package may import only
// packages on its own floor or below. internal/ is the ground floor:
// helpers that import nothing of the module (TestInternalIsGround); a
// helper of one package only sits beside it (the web console under
// cmd/inboxmill/internal), and the test harnesses under tests/.
func floor(path string) int {
	p := rel(path)
	switch {
	case p == "internal/crashrelay" || p == "internal/kafkatest" || p == "internal/layout":
		return -1 // harnesses of the examples and tests, on the ground floor too
	case strings.HasPrefix(p, "internal/"):
		return 0
	case p == "inbox":
		return 1
	case strings.HasPrefix(p, "inbox/"):
		return 2 // dialects and the store's test kit
	case p == "dedup" || strings.HasPrefix(p, "dedup/"):
		return 3
	case strings.HasPrefix(p, "handlers/"):
		return 4
	case strings.HasPrefix(p, "cmd/"):
		return 5
	}
	return -1 // examples, tests and test helpers: not part of the library
}

// TestInternalIsGround keeps internal/ one level: its packages import no
// package of the module, so that every arrow into internal/ points down.
// A helper that needs the store or the middleware belongs beside its one
// user, or under tests/ when tests share it.
func TestInternalIsGround(t *testing.T) {
	for _, p := range list(t, "./internal/...") {
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/") {
				t.Errorf("%s imports %s: packages under internal/ import nothing of the module", rel(p.ImportPath), rel(imp))
			}
		}
	}
}

var drivers = []string{
	"github.com/lib/pq",
	"github.com/jackc/pgx/v5/stdlib",
	"github.com/go-sql-driver/mysql",
	"modernc.org/sqlite",
}

// TestDependenciesPointDown checks that no library package imports one
// above it (nothing under inbox/ imports dedup or handlers), that only the
// packages whose job it is import a driver, watermill or watermill-sql,
// and that no library package imports a test helper.
func TestDependenciesPointDown(t *testing.T) {
	for _, p := range list(t, "./...") {
		f := floor(p.ImportPath)
		if f < 0 {
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/") {
				if g := floor(imp); g > f {
					t.Errorf("%s (floor %d) imports %s (floor %d): dependencies must point down", rel(p.ImportPath), f, rel(imp), g)
				}
				if r := rel(imp); strings.HasPrefix(r, "tests/") ||
					strings.HasPrefix(r, "internal/") && strings.HasSuffix(r, "test") {
					t.Errorf("%s imports the test helper %s", rel(p.ImportPath), rel(imp))
				}
			}
			for _, d := range drivers {
				if imp == d && rel(p.ImportPath) != "inbox/mysql" && !strings.HasPrefix(rel(p.ImportPath), "cmd/") {
					t.Errorf("%s imports the driver %s; only inbox/mysql (for its error type) and commands may", rel(p.ImportPath), d)
				}
			}
			if strings.HasPrefix(imp, "github.com/ThreeDotsLabs/watermill-sql") && rel(p.ImportPath) != "dedup/watermillsql" &&
				!strings.HasPrefix(rel(p.ImportPath), "cmd/") {
				t.Errorf("%s imports watermill-sql; only dedup/watermillsql may", rel(p.ImportPath))
			}
			if rel(p.ImportPath) == "inbox" && strings.HasPrefix(imp, "github.com/ThreeDotsLabs/") {
				t.Errorf("inbox imports %s; the store must not depend on watermill", imp)
			}
		}
	}
}

// TestOperatorToolingStaysOut checks that the operator tooling keeps to
// its corner: only commands import the web console and the command-line
// libraries (cobra, pflag, the progress bar), the console works on the
// store alone (no watermill, no driver: the command that serves it picks
// the database), and the headless browser is a test dependency only.
func TestOperatorToolingStaysOut(t *testing.T) {
	cliOnly := []string{"github.com/spf13/cobra", "github.com/spf13/pflag", "github.com/schollz/progressbar",
		module + "/cmd/inboxmill/internal/console"}
	for _, p := range list(t, "./...") {
		r := rel(p.ImportPath)
		isCmd := strings.HasPrefix(r, "cmd/")
		for _, imp := range p.Imports {
			for _, c := range cliOnly {
				if (imp == c || strings.HasPrefix(imp, c+"/")) && !isCmd {
					t.Errorf("%s imports %s; only commands may", r, imp)
				}
			}
			if strings.HasPrefix(imp, "github.com/chromedp/") {
				t.Errorf("%s imports %s outside its tests", r, imp)
			}
			if strings.HasPrefix(r, "cmd/inboxmill/internal/console") && strings.HasPrefix(imp, "github.com/ThreeDotsLabs/") {
				t.Errorf("%s imports %s; the console works on the store alone", r, imp)
			}
		}
	}
}

// TestSQLiteProgramLinksOnlySQLite builds a program that uses the
// middleware on SQLite and checks that it registers the sqlite driver and
// no other, and that no PostgreSQL or MySQL module is even compiled in.
func TestSQLiteProgramLinksOnlySQLite(t *testing.T) {
	const prog = "./internal/layout/testdata/sqliteonly"
	deps := list(t, "-deps", prog)
	for _, p := range deps {
		for _, banned := range []string{"github.com/lib/pq", "github.com/jackc/pgx", "github.com/go-sql-driver/mysql",
			"github.com/ThreeDotsLabs/watermill-sql"} {
			if strings.HasPrefix(p.ImportPath, banned) {
				t.Errorf("the SQLite program depends on %s", p.ImportPath)
			}
		}
	}
	cmd := exec.Command("go", "run", prog)
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run %s: %v\n%s", prog, err, out)
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, []string{"sqlite"}) {
		t.Fatalf("sql.Drivers() = %v, want [sqlite]", got)
	}
}

// TestQuickstartCompilesNoServerDriver keeps the quickstart (the first
// command a newcomer runs) from downloading or compiling the PostgreSQL or
// MySQL drivers.
func TestQuickstartCompilesNoServerDriver(t *testing.T) {
	for _, p := range list(t, "-deps", "./examples/quickstart") {
		for _, banned := range []string{"github.com/lib/pq", "github.com/jackc/pgx", "github.com/go-sql-driver/mysql"} {
			if strings.HasPrefix(p.ImportPath, banned) {
				t.Errorf("the quickstart depends on %s", p.ImportPath)
			}
		}
	}
}

// TestHorizonStaysSmall keeps package dedup/horizon a check with no
// transport of its own: it reads Kafka through sarama's admin API and a
// SQL queue through database/sql, and imports neither watermill-sql,
// watermill-kafka nor a driver. Among library packages only it and
// dedup/kafkaparallel, the Kafka subscriber, import sarama or
// watermill-kafka, so that a program that reads no Kafka does not link the
// Kafka client; and the subscriber imports no package of inboxmill's: it
// is a transport that the middleware makes safe, not a part of it.
func TestHorizonStaysSmall(t *testing.T) {
	allowed := []string{module + "/dedup", "github.com/IBM/sarama"}
	for _, p := range list(t, "./dedup/horizon") {
		for _, imp := range p.Imports {
			if !strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") {
				continue // the standard library
			}
			if !slices.Contains(allowed, imp) {
				t.Errorf("dedup/horizon imports %s; it may import only %v and the standard library", imp, allowed)
			}
		}
	}
	for _, p := range list(t, "./dedup/kafkaparallel") {
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/") {
				t.Errorf("dedup/kafkaparallel imports %s; it imports no package of the module", imp)
			}
		}
	}
	for _, p := range list(t, "./...") {
		r := rel(p.ImportPath)
		if floor(p.ImportPath) < 0 || r == "dedup/horizon" || r == "dedup/kafkaparallel" || strings.HasPrefix(r, "cmd/") {
			continue
		}
		for _, imp := range p.Imports {
			if imp == "github.com/IBM/sarama" || strings.HasPrefix(imp, "github.com/ThreeDotsLabs/watermill-kafka") {
				t.Errorf("%s imports %s; among library packages only dedup/horizon and dedup/kafkaparallel read Kafka", r, imp)
			}
		}
	}
}
