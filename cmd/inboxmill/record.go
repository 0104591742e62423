package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/inboxmill/inboxmill/inbox"
)

// errNoRecord: the flags name a record that does not exist.
var errNoRecord = errors.New("no record")

// idFlags name one record: by --operation and --key (and --scope), or by
// the --digest the logs print.
type idFlags struct {
	scope, operation, key, digest string
}

func (f *idFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.scope, "scope", "", "the record's scope (default the global scope \"\")")
	fl.StringVar(&f.operation, "operation", "", "the record's operation (with --digest: narrows the search)")
	fl.StringVar(&f.key, "key", "", "the record's key")
	fl.StringVar(&f.digest, "digest", "", "the record's key digest, the key_digest of log lines (16 hex characters)")
}

// check reports a usage error when the flags name no record or two ways.
func (f *idFlags) check(cmd *cobra.Command) error {
	switch {
	case f.digest != "" && (f.key != "" || cmd.Flags().Changed("scope")):
		return usageErr(errors.New("give either --digest (and optionally --operation) or --operation and --key (and --scope), not both"))
	case f.digest != "":
		return nil
	case f.operation == "" || f.key == "":
		return usageErr(errors.New("name the record: --operation and --key (and --scope when not the global one), or --digest"))
	}
	return nil
}

// find loads the record the flags name.
func (f *idFlags) find(ctx context.Context, i *inboxDB) (*inbox.Record, error) {
	if f.digest != "" {
		rec, err := i.store.FindByDigest(ctx, strings.ToLower(strings.TrimSpace(f.digest)), f.operation)
		switch {
		case errors.Is(err, inbox.ErrNotFound):
			where := "any operation"
			if f.operation != "" {
				where = fmt.Sprintf("operation %q", f.operation)
			}
			return nil, fmt.Errorf("%w of %s in table %s has key digest %s", errNoRecord, where, i.table, f.digest)
		case errors.Is(err, inbox.ErrInvalidKey):
			return nil, usageErr(fmt.Errorf("--digest %q: want the 16 lowercase hex characters of a key_digest", f.digest))
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

// decodeOutput reads a record's Result in the format the dedup middleware
// stores a handler's output in (dedup.EncodeOutput):
//
//	magic "IMR" | version 1 | uvarint count | count × message
//	message: bytes uuid | uvarint n | n × (bytes key, bytes value) | bytes payload
//	bytes:   uvarint length | data
//
// Payloads are reported by size only: they may carry customer data.
func decodeOutput(b []byte) ([]storedMessage, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < 4 || string(b[:3]) != "IMR" {
		return nil, errors.New("not the dedup middleware's output format")
	}
	if b[3] != 1 {
		return nil, fmt.Errorf("the dedup output format version %d, which this inboxmill does not read", b[3])
	}
	r := outputReader{b: b[4:]}
	n := r.count()
	var out []storedMessage
	for range n {
		if r.err != nil {
			break
		}
		m := storedMessage{UUID: string(r.bytes()), Metadata: map[string]string{}}
		for range r.count() {
			if r.err != nil {
				break
			}
			k := r.bytes()
			m.Metadata[string(k)] = string(r.bytes())
		}
		m.PayloadBytes = len(r.bytes())
		out = append(out, m)
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d bytes after the last message", len(r.b))
	}
	if r.err != nil {
		return nil, fmt.Errorf("corrupt dedup output: %w", r.err)
	}
	return out, nil
}

type outputReader struct {
	b   []byte
	err error
}

func (r *outputReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("bad length")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *outputReader) count() uint64 {
	v := r.uvarint()
	if r.err == nil && v > uint64(len(r.b)) {
		r.err = fmt.Errorf("count %d exceeds the data", v)
		return 0
	}
	return v
}

func (r *outputReader) bytes() []byte {
	n := r.uvarint()
	if r.err == nil && n > uint64(len(r.b)) {
		r.err = fmt.Errorf("length %d exceeds the data", n)
	}
	if r.err != nil {
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
