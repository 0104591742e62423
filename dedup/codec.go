package dedup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Stored output is a small binary format rather than JSON: UUIDs, metadata
// and payloads are arbitrary bytes (Kafka headers need not be UTF-8), and a
// duplicate must hand back exactly what the first run produced. JSON would
// replace invalid UTF-8 with U+FFFD.
//
//	magic "IMR" | version 1 | uvarint count | count × message
//	message: bytes uuid | uvarint n | n × (bytes key, bytes value) | bytes payload
//	bytes:   uvarint length | data
//
// Metadata is written in key order so the encoding is deterministic.
const (
	resultMagic   = "IMR"
	resultVersion = 1
)

var errCorrupt = errors.New("dedup: stored result is corrupt")

// EncodeOutput encodes messages the way the middleware stores a handler's
// output, for code that completes a record outside the middleware (a
// reconciler's Resolution.Result): duplicates then hand these messages to
// the router. A nil message is an error.
func EncodeOutput(msgs []*message.Message) ([]byte, error) { return encodeMessages(msgs) }

// DecodeOutput decodes what [EncodeOutput] (or the middleware) stored in a
// record's Result, for tools that show a record's output: the messages'
// UUIDs, metadata and payloads, as the router would get them back. Empty
// input is no messages. Input in another format, or cut short, is an
// error.
func DecodeOutput(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	return decodeMessages(b)
}

// encodeMessages stores what the handler produced so that a duplicate can
// hand the very same messages (UUID, metadata, payload) back to the router.
func encodeMessages(msgs []*message.Message) ([]byte, error) {
	size := len(resultMagic) + 1 + binary.MaxVarintLen64
	for i, m := range msgs {
		if m == nil {
			return nil, fmt.Errorf("dedup: the handler returned a nil message at index %d", i)
		}
		size += 3*binary.MaxVarintLen64 + len(m.UUID) + len(m.Payload)
		for k, v := range m.Metadata {
			size += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, resultMagic...)
	b = append(b, resultVersion)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	var keys []string
	for _, m := range msgs {
		b = appendBytes(b, m.UUID)
		keys = keys[:0]
		for k := range m.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b = binary.AppendUvarint(b, uint64(len(keys)))
		for _, k := range keys {
			b = appendBytes(b, k)
			b = appendBytes(b, m.Metadata[k])
		}
		b = appendBytes(b, string(m.Payload))
	}
	return b, nil
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeMessages reads what encodeMessages wrote. Empty input means the
// handler produced nothing.
func decodeMessages(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < len(resultMagic)+1 || string(b[:len(resultMagic)]) != resultMagic {
		return nil, fmt.Errorf("%w: not an inboxmill result", errCorrupt)
	}
	if v := b[len(resultMagic)]; v != resultVersion {
		return nil, fmt.Errorf("dedup: stored result has format %d, this version reads %d", v, resultVersion)
	}
	r := reader{b: b[len(resultMagic)+1:]}
	n := r.count()
	var out []*message.Message
	for i := uint64(0); i < n && r.err == nil; i++ {
		uuid := r.bytes()
		m := message.NewMessage(string(uuid), nil)
		for j, nm := uint64(0), r.count(); j < nm && r.err == nil; j++ {
			k := r.bytes()
			v := r.bytes()
			m.Metadata.Set(string(k), string(v))
		}
		if p := r.bytes(); len(p) > 0 {
			m.Payload = append([]byte(nil), p...)
		}
		out = append(out, m)
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d bytes after the last message", errCorrupt, len(r.b))
	}
	if r.err != nil {
		return nil, r.err
	}
	return out, nil
}

// reader consumes the format with bounds checks; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: bad length", errCorrupt)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads an element count, which cannot exceed the bytes left (every
// element takes at least one byte).
func (r *reader) count() uint64 {
	v := r.uvarint()
	if r.err == nil && v > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: count %d exceeds the data", errCorrupt, v)
		return 0
	}
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: length %d exceeds the data", errCorrupt, n)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
