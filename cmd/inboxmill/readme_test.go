package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
	"github.com/inboxmill/inboxmill/tests/testdb"
)

// readmeBlock returns the lines of the first sh block after heading in
// the README.
func readmeBlock(t *testing.T, heading string) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	require.True(t, ok, "README has no %q", heading)
	_, rest, ok = strings.Cut(rest, "```sh\n")
	require.True(t, ok)
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	return strings.Split(strings.TrimSpace(block), "\n")
}

// shellWords splits a command line as a POSIX shell would for the quoting
// the README uses (single and double quotes, backslashes), dropping a
// trailing comment.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var (
		words []string
		cur   strings.Builder
		in    bool // a word is under way
		quote rune
	)
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote == '\'':
			cur.WriteRune(r)
		case quote == '"' && r == '\\' && i+1 < len(rs):
			i++
			cur.WriteRune(rs[i])
		case quote == '"':
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == '\\' && i+1 < len(rs):
			i++
			cur.WriteRune(rs[i])
			in = true
		case r == '#' && !in:
			return words
		case r == ' ' || r == '\t':
			if in {
				words, in = append(words, cur.String()), false
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	require.Zero(t, quote, "unbalanced quote in %q", line)
	if in {
		words = append(words, cur.String())
	}
	return words
}

// TestREADMEOperatorCommands runs the README's operator commands as
// printed: the quickstart with -operator makes the inbox, the alias and
// the environment variable are what the block says, and every inboxmill
// line then exits 0 — on a terminal where the operator answers yes —
// except serve, which runs until stopped (TestServe covers it).
func TestREADMEOperatorCommands(t *testing.T) {
	lines := readmeBlock(t, "## Operating inboxmill")
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "inboxmill-quickstart.db")
	vars := map[string]string{}
	var ran []string
	for _, line := range lines {
		words := shellWords(t, line)
		require.NotEmpty(t, words, line)
		switch words[0] {
		case "go":
			require.Equal(t, []string{"go", "run", "./examples/quickstart", "-operator"}, words, line)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			cmd := exec.CommandContext(ctx, "go", "run", "./examples/quickstart", "-operator", "-db", dbPath)
			cmd.Dir = "../.."
			out, err := cmd.CombinedOutput()
			cancel()
			require.NoError(t, err, "%s", out)
			require.Contains(t, string(out), "book_carrier evt-0003 is pending (key_digest 2a44e2c57c700612)")
			require.Contains(t, string(out), "book_carrier evt-0005 is failed")
		case "alias":
			require.Equal(t, []string{"alias", "inboxmill=go run ./cmd/inboxmill"}, words, line)
		case "export":
			k, v, ok := strings.Cut(words[1], "=")
			require.True(t, ok, line)
			require.Equal(t, "INBOXMILL_DSN", k)
			require.Equal(t, "inboxmill-quickstart.db", v, "the quickstart's file")
			vars[k] = dbPath // the same file, from the test's directory
		case "inboxmill":
			if words[1] == "serve" {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			var stdout, stderr bytes.Buffer
			a := &app{stdin: strings.NewReader("yes\n"), stdout: &stdout, stderr: &stderr,
				getenv: func(k string) string { return vars[k] }, actorDefault: func() string { return "operator" },
				isTerminal: func(io.Reader) bool { return true }}
			code := a.run(ctx, words[1:])
			cancel()
			require.Equal(t, exitOK, code, "%s\nstdout:\n%s\nstderr:\n%s", line, stdout.String(), stderr.String())
			ran = append(ran, words[1])
		default:
			t.Fatalf("a line the test does not know: %s", line)
		}
	}
	require.Equal(t, []string{"stats", "list", "inspect", "resolve", "forget", "purge", "audit"}, ran)

	// What the lines did: the pending booking is completed (with its
	// audit entry), the failed one is still there (a dry run), and the
	// purge found nothing expired.
	db := testdb.OpenSQLite(t, dbPath)
	store, err := inbox.NewStore(db, testdb.Dialect(testdb.SQLite), inbox.Config{})
	require.NoError(t, err)
	defer store.Close()
	rec, err := store.Get(context.Background(), db, inbox.ID{Scope: "shop-1", Operation: "book_carrier", Key: "evt-0003"})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusCompleted, rec.Status)
	rec, err = store.Get(context.Background(), db, inbox.ID{Scope: "shop-1", Operation: "book_carrier", Key: "evt-0005"})
	require.NoError(t, err)
	require.Equal(t, inbox.StatusFailed, rec.Status)
	entries, _, err := store.ListAudit(context.Background(), inbox.AuditFilter{})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, inbox.ActionResolve, entries[0].Action)
}

func TestShellWords(t *testing.T) {
	for line, want := range map[string][]string{
		`inboxmill stats`:                          {"inboxmill", "stats"},
		`a --reason 'x (y)'   # comment`:           {"a", "--reason", "x (y)"},
		`alias inboxmill='go run ./cmd/inboxmill'`: {"alias", "inboxmill=go run ./cmd/inboxmill"},
		`a "b \"c\"" d\ e`:                         {"a", `b "c"`, "d e"},
		`a x#y`:                                    {"a", "x#y"},
	} {
		require.Equal(t, want, shellWords(t, line), line)
	}
}
