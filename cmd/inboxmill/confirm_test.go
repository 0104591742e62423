package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/inbox"
)

// runTerminal runs the command against e's table as if its standard input
// were a terminal on which the operator types what stdin holds.
func (e *env) runTerminal(t *testing.T, stdin io.Reader, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	a := &app{stdin: stdin, stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" },
		actorDefault: func() string { return "tester" }, isTerminal: func(io.Reader) bool { return true }}
	code := a.run(ctx, append(args, "--dsn", e.dsn, "--table", e.table))
	return result{code, stdout.String(), stderr.String()}
}

// askedReader is a terminal's input that tells when the command first
// reads it: after it printed its question.
type askedReader struct {
	r     io.Reader
	asked chan struct{}
	once  sync.Once
}

func newAskedReader(r io.Reader) *askedReader { return &askedReader{r: r, asked: make(chan struct{})} }

func (a *askedReader) Read(p []byte) (int, error) {
	a.once.Do(func() { close(a.asked) })
	return a.r.Read(p)
}

// TestDestructiveCommandsAsk: forget and purge ask on a terminal and act
// only on "yes"; --yes is for scripts; without it, on a standard input
// that is not a terminal, they refuse before opening anything. Dry runs
// never ask.
func TestDestructiveCommandsAsk(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		done := e.completed(t, id("ship", "evt-1"))
		for n := range 3 {
			e.expired(t, id("ship", fmt.Sprintf("old-%d", n)), inbox.StatusCompleted)
		}

		// Not a terminal, no --yes: refused, exit 2, nothing changed.
		for _, args := range [][]string{
			{"forget", "--digest", done.Digest(), "--reason", "r"},
			{"purge", "--reason", "r"},
		} {
			r := e.run(t, args...)
			require.Equal(t, exitUsage, r.code, r.String())
			require.Contains(t, r.stderr, args[0]+" changes the inbox and asks for confirmation on a terminal, "+
				"and standard input is not one: pass --yes to go ahead (or --dry-run to see what it would do)")
			require.Empty(t, r.stdout)
		}
		// Dry runs do not ask.
		e.ok(t, "forget", "--digest", done.Digest(), "--reason", "r", "--dry-run")
		e.ok(t, "purge", "--reason", "r", "--dry-run")
		require.Equal(t, int64(4), e.total(t))
		require.Empty(t, e.audit(t))

		// On a terminal: anything but yes, or no answer at all, changes
		// nothing (exit 1).
		for _, answer := range []string{"no\n", "\n", "", "yes please\n"} {
			r := e.runTerminal(t, strings.NewReader(answer), "forget", "--digest", done.Digest(), "--reason", "r")
			require.Equal(t, exitFailed, r.code, "%q: %s", answer, r)
			require.Contains(t, r.stderr, "forget ship/"+done.Digest()+" (key evt-1), completed at attempt 1? "+
				"Its next delivery runs the handler again.\ntype yes to go ahead: ")
			require.Contains(t, r.stderr, "inboxmill forget: not confirmed; nothing changed")
			require.Empty(t, r.stdout)
			r = e.runTerminal(t, strings.NewReader(answer), "purge", "--reason", "r", "--progress=false")
			require.Equal(t, exitFailed, r.code, "%q: %s", answer, r)
			require.Contains(t, r.stderr, "purge 3 records from table "+e.table+" (completed and failed, past expires_at; "+
				"the oldest expired ")
			require.Contains(t, r.stderr, "inboxmill purge: not confirmed; nothing changed")
		}
		require.Equal(t, int64(4), e.total(t))
		require.Empty(t, e.audit(t))

		// Yes.
		r := e.runTerminal(t, strings.NewReader("yes\n"), "forget", "--digest", done.Digest(), "--reason", "r")
		require.Equal(t, exitOK, r.code, r.String())
		require.Contains(t, r.stdout, "forgot ship/"+done.Digest())
		e.gone(t, done.ID)
		r = e.runTerminal(t, strings.NewReader("Y\n"), "purge", "--reason", "r", "--progress=false")
		require.Equal(t, exitOK, r.code, r.String())
		require.Contains(t, r.stdout, "purged 3 records from table "+e.table)
		require.Zero(t, e.total(t))
		require.Len(t, e.audit(t), 2)

		// Nothing to purge: nothing to ask.
		r = e.runTerminal(t, strings.NewReader(""), "purge", "--reason", "r")
		require.Equal(t, exitOK, r.code, r.String())
		require.Contains(t, r.stdout, "nothing to purge")
		require.NotContains(t, r.stderr, "type yes")

		// --yes, for scripts.
		again := e.completed(t, id("ship", "evt-2"))
		e.ok(t, "forget", "--digest", again.Digest(), "--reason", "r", "--yes")
		e.gone(t, again.ID)
	})
}

// TestConfirmedForgetIsFencedByWhatWasShown: a worker that takes the
// record over while the operator reads the question wins; the "yes" that
// follows deletes nothing.
func TestConfirmedForgetIsFencedByWhatWasShown(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		rec := e.abandoned(t, id("charge", "pi-1"))
		pr, answer := io.Pipe()
		in := newAskedReader(pr)
		done := make(chan result, 1)
		go func() { done <- e.runTerminal(t, in, "forget", "--digest", rec.Digest(), "--reason", "r") }()
		// Take the record over while the question waits for its answer.
		<-in.asked
		_, err := e.store.TakeOver(context.Background(), rec, inbox.TakeOverParams{Owner: "worker-2", Lease: time.Hour})
		require.NoError(t, err)
		_, err = io.WriteString(answer, "yes\n")
		require.NoError(t, err)
		r := <-done
		require.Contains(t, r.stderr, "processing at attempt 1? Its next delivery runs the handler again.")
		require.Equal(t, exitRefused, r.code, r.String())
		require.Equal(t, inbox.StatusProcessing, e.get(t, rec.ID).Status)
		require.Empty(t, e.audit(t))
	})
}

// TestConfirmedPurgeDeletesWhatWasCounted: a record that expires while
// the operator reads the question is not in the count, and the purge
// that follows the "yes" leaves it.
func TestConfirmedPurgeDeletesWhatWasCounted(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.expired(t, id("ship", "old"), inbox.StatusCompleted)
		soon := id("ship", "soon")
		tx, err := e.store.BeginTx(context.Background(), nil)
		require.NoError(t, err)
		_, err = e.store.Claim(context.Background(), tx, inbox.ClaimParams{ID: soon, PayloadHash: hash(soon), Retention: 4 * time.Second})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		expires := e.get(t, soon).ExpiresAt

		pr, answer := io.Pipe()
		in := newAskedReader(pr)
		done := make(chan result, 1)
		go func() { done <- e.runTerminal(t, in, "purge", "--reason", "r", "--progress=false") }()
		<-in.asked
		require.True(t, time.Now().Before(expires), "the count came after the record expired: nothing to show")
		time.Sleep(time.Until(expires) + 500*time.Millisecond)
		_, err = io.WriteString(answer, "yes\n")
		require.NoError(t, err)
		r := <-done
		require.Equal(t, exitOK, r.code, r.String())
		require.Contains(t, r.stderr, "purge 1 record from table ")
		require.Contains(t, r.stdout, "purged 1 record from table ")
		e.gone(t, id("ship", "old"))
		require.Equal(t, inbox.StatusCompleted, e.get(t, soon).Status, "expired after the count: kept for the next purge")
	})
}
