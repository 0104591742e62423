package canonjson_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/inboxmill/inboxmill/internal/canonjson"
)

func ExampleCanonicalize() {
	// The same order, delivered twice: different formatting, member order,
	// escaping and send time.
	first := []byte(`{"order_id":"o-1","amount":"12.50","meta":{"sent_at":"2024-05-01T10:00:00Z","producer":"checkout"}}`)
	second := []byte(`{
		"meta": {"producer": "checkout", "sent_at": "2024-05-01T10:00:07Z"},
		"amount": "12.50",
		"order_id": "o\u002d1"
	}`)
	sentAt, err := canonjson.ParsePath("meta.sent_at")
	if err != nil {
		panic(err)
	}
	ignore := []canonjson.Path{sentAt}

	a, err := canonjson.Canonicalize(first, ignore)
	if err != nil {
		panic(err)
	}
	b, err := canonjson.Canonicalize(second, ignore)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(a))
	fmt.Println(bytes.Equal(a, b))
	// Output:
	// {"amount":"12.50","meta":{"producer":"checkout"},"order_id":"o-1"}
	// true
}

// fingerprint shows the intended use: hash the canonical form, and fall back
// to the raw bytes when the payload cannot be canonicalised.
func fingerprint(payload []byte, ignore []canonjson.Path) ([32]byte, error) {
	canon, err := canonjson.Canonicalize(payload, ignore)
	switch {
	case errors.Is(err, canonjson.ErrNotCanonicalizable):
		return sha256.Sum256(payload), nil
	case err != nil:
		return [32]byte{}, err
	}
	return sha256.Sum256(canon), nil
}

func ExampleErrNotCanonicalizable() {
	// Duplicate keys are refused: decoders disagree on which one wins.
	_, err := canonjson.Canonicalize([]byte(`{"amount":1,"amount":2}`), nil)
	fmt.Println(errors.Is(err, canonjson.ErrNotCanonicalizable))

	x, _ := fingerprint([]byte(`{"amount":1,"amount":2}`), nil)
	y, _ := fingerprint([]byte(`{"amount":2,"amount":1}`), nil)
	fmt.Println(x == y)
	// Output:
	// true
	// false
}
