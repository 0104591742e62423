package dedup

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/inboxmill/inboxmill/internal/canonjson"
)

// KeyFunc derives a message's idempotency key: the ID of the business event
// or intent, stable across redeliveries, producer retries and replays. It
// returns an error wrapping ErrMissingKey or ErrInvalidKey when it cannot.
//
// Never derive it from message.Message.UUID: that identifies a delivery
// (producers retrying a publish mint a new one), is empty for messages that
// Kafka producers outside Watermill wrote, and watermill-sql caps it at 36
// characters.
type KeyFunc func(msg *message.Message) (string, error)

// ScopeFunc derives a message's scope, typically its tenant. Records in
// different scopes never collide.
type ScopeFunc func(msg *message.Message) (string, error)

// KeyFromMetadata reads the key from a metadata field (a Kafka header, an
// AMQP header, a watermill-sql metadata entry), e.g. "event_id". A missing or
// empty field is ErrMissingKey.
func KeyFromMetadata(field string) KeyFunc {
	src := fmt.Sprintf("metadata %q", field)
	return func(msg *message.Message) (string, error) {
		v := msg.Metadata.Get(field)
		if v == "" {
			return "", &KeyError{Part: "key", Source: src, Err: ErrMissingKey}
		}
		return v, nil
	}
}

// KeyFromJSON reads the key from a field of the JSON payload named by a
// dotted path from the root, e.g. "id" or "data.object.id". The field must
// be a non-empty string or a number (its literal text is the key). A payload
// that is not a JSON object, or lacks the field, is ErrMissingKey; a field of
// another type is ErrInvalidKey.
func KeyFromJSON(path string) KeyFunc {
	src := fmt.Sprintf("JSON field %q", path)
	parts := strings.Split(path, ".")
	return func(msg *message.Message) (string, error) {
		v, err := jsonField(msg.Payload, parts)
		if err != nil {
			return "", &KeyError{Part: "key", Source: src, Err: err}
		}
		return v, nil
	}
}

// KeyFromFunc adapts any function to a KeyFunc; an empty result is
// ErrMissingKey.
func KeyFromFunc(f func(msg *message.Message) (string, error)) KeyFunc {
	return func(msg *message.Message) (string, error) {
		v, err := f(msg)
		if err != nil {
			return "", err
		}
		if v == "" {
			return "", &KeyError{Part: "key", Source: "key function", Err: ErrMissingKey}
		}
		return v, nil
	}
}

// ScopeFromMetadata reads the scope from a metadata field, e.g. "tenant_id".
// A message without it is refused with ErrMissingKey rather than processed
// in a shared scope, where tenants' keys could collide.
func ScopeFromMetadata(field string) ScopeFunc {
	src := fmt.Sprintf("metadata %q", field)
	return func(msg *message.Message) (string, error) {
		v := msg.Metadata.Get(field)
		if v == "" {
			return "", &KeyError{Part: "scope", Source: src, Err: ErrMissingKey}
		}
		return v, nil
	}
}

// ScopeConstant puts every message in the same scope.
func ScopeConstant(scope string) ScopeFunc {
	return func(*message.Message) (string, error) { return scope, nil }
}

// jsonField walks parts through nested objects, decoding one level at a time
// into raw messages so that nothing beyond the path is materialised.
func jsonField(payload []byte, parts []string) (string, error) {
	raw := json.RawMessage(payload)
	for i, p := range parts {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
			if i == 0 {
				return "", fmt.Errorf("%w: payload is not a JSON object", ErrMissingKey)
			}
			return "", fmt.Errorf("%w: %q is not an object", ErrMissingKey, strings.Join(parts[:i], "."))
		}
		v, ok := obj[p]
		if !ok {
			return "", ErrMissingKey
		}
		raw = v
	}
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) > 0 && raw[0] == '"':
		// encoding/json would turn invalid UTF-8 and lone surrogates into
		// U+FFFD, folding distinct keys into one; the canonicaliser refuses them.
		if _, err := canonjson.Canonicalize(raw, nil); err != nil {
			return "", fmt.Errorf("%w: the field is not a valid UTF-8 string", ErrInvalidKey)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("%w: %v", ErrInvalidKey, err)
		}
		if s == "" {
			return "", ErrMissingKey
		}
		return s, nil
	case len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')):
		return string(raw), nil
	case string(raw) == "null":
		return "", ErrMissingKey
	default:
		return "", fmt.Errorf("%w: the field is neither a string nor a number", ErrInvalidKey)
	}
}
