package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/inboxmill/inboxmill/dedup"
	"github.com/inboxmill/inboxmill/inbox"
)

// errNoRecord: the flags name a record that does not exist.
var errNoRecord = errors.New("no record")

// idFlags name one record: by --operation and --key (and --scope), or by
// the --digest the logs print.
type idFlags struct {
	scope, operation, key, digest string
	byScope                       bool // --scope was given
}

func (f *idFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.scope, "scope", "", "the record's scope (default the global scope \"\"; with --digest: narrows the search, and shortens it)")
	fl.StringVar(&f.operation, "operation", "", "the record's operation (with --digest: narrows the search)")
	fl.StringVar(&f.key, "key", "", "the record's key")
	fl.StringVar(&f.digest, "digest", "", "the record's key digest, the key_digest of log lines (16 hex characters)")
}

// check reports a usage error when the flags name no record or two ways,
// and notes whether --scope was given (find narrows a search by digest
// to it).
func (f *idFlags) check(cmd *cobra.Command) error {
	f.byScope = cmd.Flags().Changed("scope")
	switch {
	case f.digest != "" && f.key != "":
		return usageErr(errors.New("give either --digest (and optionally --operation, --scope) or --operation and --key (and --scope), not both"))
	case f.digest != "":
		if !isDigest(strings.ToLower(strings.TrimSpace(f.digest))) {
			return usageErr(fmt.Errorf("--digest %q: want the 16 hex characters of a key_digest", f.digest))
		}
	case f.operation == "" || f.key == "":
		return usageErr(errors.New("name the record: --operation and --key (and --scope when not the global one), or --digest"))
	}
	// No record can hold what the store cannot store: say which flag is
	// at fault before anything is sent (PostgreSQL would refuse invalid
	// UTF-8 with an error of its own).
	var errs []error
	for _, p := range []struct {
		flag, v string
		max     int
	}{{"scope", f.scope, inbox.MaxScopeLen}, {"operation", f.operation, inbox.MaxOperationLen}, {"key", f.key, inbox.MaxKeyLen}} {
		if err := inbox.CheckText(p.v, p.max); err != nil {
			errs = append(errs, fmt.Errorf("--%s %w", p.flag, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return usageErr(err)
	}
	return nil
}

// find loads the record the flags name. A search by digest that takes
// more than a second shows how far it got on stderr, when that is a
// terminal.
func (f *idFlags) find(ctx context.Context, i *inboxDB, stderr io.Writer) (*inbox.Record, error) {
	if f.digest != "" {
		progress, done := digestProgress(stderr, i.table)
		rec, err := i.store.ScanDigest(ctx, inbox.DigestScan{Digest: strings.ToLower(strings.TrimSpace(f.digest)),
			Operation: f.operation, Scope: f.scope, ByScope: f.byScope, Progress: progress})
		done()
		switch {
		case errors.Is(err, inbox.ErrNotFound):
			where := "any operation"
			if f.operation != "" {
				where = fmt.Sprintf("operation %q", f.operation)
			}
			if f.byScope {
				where += " in scope " + text(f.scope)
			}
			return nil, fmt.Errorf("%w of %s in table %s has key digest %s", errNoRecord, where, i.table, f.digest)
		case errors.Is(err, inbox.ErrInvalidKey):
			return nil, usageErr(&shownError{msg: invalidReasons(err), err: err}) // check lets nothing through
		}
		return rec, err
	}
	id := f.id()
	rec, err := i.store.Get(ctx, i.db, id)
	if errors.Is(err, inbox.ErrNotFound) {
		return nil, fmt.Errorf("%w in table %s has scope %s, operation %s and key %s (digest %s)",
			errNoRecord, i.table, text(id.Scope), text(id.Operation), text(id.Key), id.Digest())
	}
	if errors.Is(err, inbox.ErrInvalidKey) {
		return nil, usageErr(err)
	}
	return rec, err
}

// isDigest reports whether s is a key digest as logs print it: 16
// lowercase hex characters.
func isDigest(s string) bool {
	if len(s) != 16 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func (f *idFlags) id() inbox.ID { return inbox.ID{Scope: f.scope, Operation: f.operation, Key: f.key} }

// idArgs renders the flags that name id in a suggested command: by
// --key, or by --digest when a part of the ID holds characters a terminal
// would interpret.
func idArgs(id inbox.ID) string {
	if text(id.Operation) != id.Operation || (id.Scope != "" && text(id.Scope) != id.Scope) || text(id.Key) != id.Key {
		op := ""
		if text(id.Operation) == id.Operation {
			op = " --operation " + shellQuote(id.Operation)
		}
		return op + " --digest " + id.Digest()
	}
	s := ""
	if id.Scope != "" {
		s += " --scope " + shellQuote(id.Scope)
	}
	return s + " --operation " + shellQuote(id.Operation) + " --key " + shellQuote(id.Key)
}

// storedMessage is one message of a record's stored output.
type storedMessage struct {
	UUID         string            `json:"uuid"`
	Metadata     map[string]string `json:"metadata"`
	PayloadBytes int               `json:"payload_bytes"`
}

// decodeOutput reads a record's Result as the dedup middleware stores a
// handler's output. Payloads are reported by size only: they may carry
// customer data.
func decodeOutput(b []byte) ([]storedMessage, error) {
	msgs, err := dedup.DecodeOutput(b)
	if err != nil {
		return nil, err
	}
	var out []storedMessage
	for _, msg := range msgs {
		m := storedMessage{UUID: msg.UUID, Metadata: map[string]string{}, PayloadBytes: len(msg.Payload)}
		for k, v := range msg.Metadata {
			m.Metadata[k] = v
		}
		out = append(out, m)
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// digestProgress returns a progress report for a search by digest: when
// w is a terminal, once the search has run for a second, a line with the
// keys read so far; nil elsewhere. done ends the line.
func digestProgress(w io.Writer, table string) (progress func(keysRead int64), done func()) {
	if f, ok := w.(*os.File); !ok || !term.IsTerminal(int(f.Fd())) {
		return nil, func() {}
	}
	start, last, shown := time.Now(), time.Time{}, false
	progress = func(n int64) {
		now := time.Now()
		if now.Sub(start) < time.Second || now.Sub(last) < 200*time.Millisecond {
			return
		}
		last, shown = now, true
		fmt.Fprintf(w, "\rsearching table %s by digest: %s keys read, %s", table, thousands(n),
			now.Sub(start).Round(time.Second))
	}
	return progress, func() {
		if shown {
			fmt.Fprintln(w)
		}
	}
}

// thousands writes n with a comma between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
