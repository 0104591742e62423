package dedup

import (
	"crypto/sha256"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/internal/canonjson"
)

// FingerprintFunc returns the fingerprint of a message's business payload.
// Two deliveries with the same key and equal fingerprints are the same
// intent; different fingerprints are a conflict.
type FingerprintFunc func(msg *message.Message) ([]byte, error)

// JSONFingerprint returns the default fingerprint: SHA-256 over the
// payload's canonical JSON (object members sorted, insignificant whitespace
// and string escapes normalised, the fields at the ignore paths removed), or
// over the raw payload when it is not JSON that canonicalises (not UTF-8,
// duplicate object keys, not JSON at all). Numbers are compared by their
// text, so 1 and 1.0 differ: a false conflict is visible and safe, a false
// duplicate would silently drop an intent.
//
// Ignore paths are dotted member names from the root, e.g. "sent_at" or
// "meta.trace_id", for fields that vary between deliveries of one intent.
// Metadata is never part of the fingerprint.
func JSONFingerprint(ignore ...string) (FingerprintFunc, error) {
	paths := make([]canonjson.Path, 0, len(ignore))
	for _, s := range ignore {
		p, err := canonjson.ParsePath(s)
		if err != nil {
			return nil, fmt.Errorf("%w: ignore path %q: %v", ErrInvalidConfig, s, err)
		}
		paths = append(paths, p)
	}
	return func(msg *message.Message) ([]byte, error) {
		return fingerprintJSON(msg.Payload, paths), nil
	}, nil
}

// RawFingerprint hashes the payload bytes as they are.
func RawFingerprint(msg *message.Message) ([]byte, error) {
	h := sha256.New()
	h.Write([]byte("raw\x00"))
	h.Write(msg.Payload)
	return h.Sum(nil), nil
}

func fingerprintJSON(payload []byte, ignore []canonjson.Path) []byte {
	h := sha256.New()
	if !mayBeJSON(payload) {
		// What Canonicalize would refuse at its first token, without the
		// error it would build: binary and plain-text payloads (webhook
		// bodies, protobuf) hash raw at once.
		h.Write([]byte("raw\x00"))
		h.Write(payload)
		return h.Sum(nil)
	}
	if canon, err := canonjson.Canonicalize(payload, ignore); err == nil {
		// Domain separation: a canonical form and a raw payload that happen
		// to be the same bytes still hash apart.
		h.Write([]byte("json\x00"))
		h.Write(canon)
	} else {
		h.Write([]byte("raw\x00"))
		h.Write(payload)
	}
	return h.Sum(nil)
}

// mayBeJSON reports whether payload's first byte after JSON whitespace can
// begin a JSON value. When it cannot, the payload is not JSON at all.
func mayBeJSON(payload []byte) bool {
	for _, c := range payload {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{', '[', '"', '-', 't', 'f', 'n':
			return true
		default:
			return c >= '0' && c <= '9'
		}
	}
	return false
}
