package dedup_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/dedup"
)

// FuzzKeyFromJSON feeds any payload to KeyFromJSON at a few paths, and
// any text as a key a producer writes into a JSON payload. Invariants:
//
//   - it never panics;
//   - a refusal is a *KeyError wrapping ErrMissingKey or ErrInvalidKey,
//     exactly one of them (poison, never retryable), whose message names
//     the path and not the payload;
//   - an accepted key is what encoding/json reads at the path (a string's
//     value, a number's literal text), never empty, and valid UTF-8: a
//     string that encoding/json decodes lossily (invalid UTF-8, a lone
//     surrogate) is refused, never folded into another event's key;
//   - a non-empty valid UTF-8 string written into a payload as its "id"
//     with encoding/json comes back as the same key.
//
// The seed corpus is testdata/fuzz/FuzzKeyFromJSON.
func FuzzKeyFromJSON(f *testing.F) {
	paths := []string{"id", "data.object.id", "a.b"}
	keys := map[string]dedup.KeyFunc{}
	for _, p := range paths {
		keys[p] = dedup.KeyFromJSON(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		for _, path := range paths {
			got, err := keys[path](message.NewMessage("u", payload))
			if err != nil {
				var ke *dedup.KeyError
				if !errors.As(err, &ke) || ke.Part != "key" {
					t.Fatalf("%s: %q: not a key error: %v", path, payload, err)
				}
				if errors.Is(err, dedup.ErrMissingKey) == errors.Is(err, dedup.ErrInvalidKey) {
					t.Fatalf("%s: %q: neither or both of missing and invalid: %v", path, payload, err)
				}
				if !dedup.IsPoison(err) || dedup.IsRetryable(err) {
					t.Fatalf("%s: %q: a key error must be poison and not retryable: %v", path, payload, err)
				}
				if len(payload) > 8 && strings.Contains(err.Error(), string(payload)) {
					t.Fatalf("%s: the error quotes the payload: %v", path, err)
				}
				continue
			}
			if got == "" || !utf8.ValidString(got) {
				t.Fatalf("%s: %q: key %q", path, payload, got)
			}
			want, ok := reference(payload, strings.Split(path, "."))
			if !ok || want != got {
				t.Fatalf("%s: %q: key %q, encoding/json reads %q (%v)", path, payload, got, want, ok)
			}
		}

		// The payload's bytes as a key a producer writes.
		key := string(payload)
		if key == "" || !utf8.ValidString(key) {
			return
		}
		body, err := json.Marshal(map[string]string{"id": key})
		if err != nil {
			t.Fatal(err)
		}
		got, err := keys["id"](message.NewMessage("u", body))
		if err != nil || got != key {
			t.Fatalf("key %q written as %s reads back as %q, %v", key, body, got, err)
		}
	})
}

// reference reads the value at parts as encoding/json does, numbers as
// their literal text.
func reference(payload []byte, parts []string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return "", false
	}
	if _, err := dec.Token(); err == nil {
		return "", false // trailing data
	}
	for _, p := range parts {
		obj, ok := v.(map[string]any)
		if !ok {
			return "", false
		}
		if v, ok = obj[p]; !ok {
			return "", false
		}
	}
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	}
	return "", false
}
