package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"testing"

	"github.com/inboxmill/inboxmill/internal/canonjson"
)

// FuzzJSONFingerprint feeds any payload to the default fingerprint.
// Invariants:
//
//   - it never panics and always returns a SHA-256;
//   - the shortcut that hashes a payload raw without trying to
//     canonicalise it (mayBeJSON) never changes the answer: the
//     fingerprint is what canonicalising first, and hashing raw only on
//     refusal, gives;
//   - whitespace is insignificant: a payload that canonicalises has the
//     fingerprint of its indented form, so a producer that pretty-prints
//     its retry is no conflict;
//   - a payload that does not canonicalise, and one that does, never
//     share a fingerprint by sharing bytes (domain separation).
//
// The seed corpus is testdata/fuzz/FuzzJSONFingerprint.
func FuzzJSONFingerprint(f *testing.F) {
	f.Fuzz(func(t *testing.T, payload []byte) {
		got := fingerprintJSON(payload, nil)
		if len(got) != sha256.Size {
			t.Fatalf("%q: %d bytes", payload, len(got))
		}
		h := sha256.New()
		canon, err := canonjson.Canonicalize(payload, nil)
		if err == nil {
			h.Write([]byte("json\x00"))
			h.Write(canon)
		} else {
			h.Write([]byte("raw\x00"))
			h.Write(payload)
		}
		if want := h.Sum(nil); !bytes.Equal(got, want) {
			t.Fatalf("%q: the shortcut changed the fingerprint (canonicalises: %v)", payload, err == nil)
		}
		if err != nil {
			return
		}
		var indented bytes.Buffer
		if json.Indent(&indented, payload, "  ", "\t") == nil {
			if again := fingerprintJSON(indented.Bytes(), nil); !bytes.Equal(got, again) {
				t.Fatalf("%q and its indented form %q differ", payload, indented.Bytes())
			}
		}
		// Hashed raw, the canonical bytes are another fingerprint.
		raw := sha256.New()
		raw.Write([]byte("raw\x00"))
		raw.Write(canon)
		if bytes.Equal(got, raw.Sum(nil)) {
			t.Fatalf("%q: the JSON and the raw domain share a fingerprint", payload)
		}
	})
}
