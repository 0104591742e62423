package dedup

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// resultFormat versions the encoding of stored messages.
const resultFormat = 1

type storedResult struct {
	V        int             `json:"v"`
	Messages []storedMessage `json:"messages"`
}

type storedMessage struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}

// encodeMessages stores what the handler produced so that a duplicate can
// hand the very same messages (UUID, metadata, payload) back to the router.
func encodeMessages(msgs []*message.Message) ([]byte, error) {
	r := storedResult{V: resultFormat, Messages: make([]storedMessage, len(msgs))}
	for i, m := range msgs {
		if m == nil {
			return nil, fmt.Errorf("dedup: the handler returned a nil message at index %d", i)
		}
		r.Messages[i] = storedMessage{UUID: m.UUID, Metadata: m.Metadata, Payload: m.Payload}
	}
	return json.Marshal(r)
}

func decodeMessages(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var r storedResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("dedup: stored result: %w", err)
	}
	if r.V != resultFormat {
		return nil, fmt.Errorf("dedup: stored result has format %d, this version reads %d", r.V, resultFormat)
	}
	out := make([]*message.Message, len(r.Messages))
	for i, sm := range r.Messages {
		m := message.NewMessage(sm.UUID, sm.Payload)
		for k, v := range sm.Metadata {
			m.Metadata.Set(k, v)
		}
		out[i] = m
	}
	return out, nil
}
