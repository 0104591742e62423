package dedup

import (
	"crypto/sha256"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/internal/canonjson"
)

// codecMsg builds a message with the given metadata pairs.
func codecMsg(uuid string, payload []byte, meta ...string) *message.Message {
	m := message.NewMessage(uuid, payload)
	for i := 0; i+1 < len(meta); i += 2 {
		m.Metadata.Set(meta[i], meta[i+1])
	}
	return m
}

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	tests := []struct {
		name string
		msgs []*message.Message
	}{
		{name: "zero messages (nil)", msgs: nil},
		{name: "zero messages (empty)", msgs: []*message.Message{}},
		{name: "one JSON message", msgs: []*message.Message{
			codecMsg("0b6f1a44-6a0c-4d5e-9a0e-2f4d3c1b0a99", []byte(`{"order":"o-1"}`), "event_id", "derived-1"),
		}},
		{name: "metadata", msgs: []*message.Message{
			codecMsg("u-1", []byte("x"),
				"content-type", "application/json",
				"empty", "",
				"html", `<a href="x">&amp;</a>`,
				"unicode", "héllo wörld ✓ \u2028",
				"control", "line1\nline2\t\x00\x01",
				"", "empty name"),
		}},
		{name: "binary payload", msgs: []*message.Message{codecMsg("u-bin", allBytes)}},
		{name: "invalid UTF-8 payload", msgs: []*message.Message{codecMsg("u-utf", []byte{0xff, 0xfe, 'a', 0xc3})}},
		{name: "nil payload", msgs: []*message.Message{codecMsg("u-nil", nil)}},
		{name: "empty payload", msgs: []*message.Message{codecMsg("u-empty", []byte{})}},
		{name: "empty UUID", msgs: []*message.Message{codecMsg("", []byte("p"))}},
		{name: "several, order kept", msgs: []*message.Message{
			codecMsg("u-3", []byte("third?"), "i", "0"),
			codecMsg("u-1", []byte("first?"), "i", "1"),
			codecMsg("u-2", []byte{0, 0, 0}, "i", "2"),
			codecMsg("u-1", []byte("same UUID twice"), "i", "3"),
		}},
		{name: "large payload", msgs: []*message.Message{codecMsg("u-big", []byte(strings.Repeat("0123456789abcdef", 64<<10)))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			enc, err := encodeMessages(tt.msgs)
			require.NoError(t, err)
			require.NotEmpty(t, enc, "even zero messages encode to a non-empty document")

			got, err := decodeMessages(enc)
			require.NoError(t, err)
			require.Len(t, got, len(tt.msgs))
			for i, want := range tt.msgs {
				require.NotNil(t, got[i])
				require.Equal(t, want.UUID, got[i].UUID, "message %d", i)
				require.Equal(t, string(want.Payload), string(got[i].Payload), "message %d (nil and empty payloads are the same to watermill)", i)
				require.Equal(t, len(want.Metadata), len(got[i].Metadata), "message %d", i)
				for k, v := range want.Metadata {
					require.Equal(t, v, got[i].Metadata.Get(k), "message %d metadata %q", i, k)
				}
				require.NotNil(t, got[i].Metadata, "decoded messages have a usable metadata map")
				got[i].Metadata.Set("writable", "yes")
			}

			// Decoding again yields fresh messages: a replay must not hand
			// the same values to two deliveries.
			again, err := decodeMessages(enc)
			require.NoError(t, err)
			for i := range again {
				require.NotSame(t, got[i], again[i])
				require.Empty(t, again[i].Metadata.Get("writable"))
			}
		})
	}
}

func TestCodecEncodeIsDeterministic(t *testing.T) {
	t.Parallel()
	msgs := []*message.Message{codecMsg("u", []byte("p"), "b", "2", "a", "1", "c", "3")}
	first, err := encodeMessages(msgs)
	require.NoError(t, err)
	for range 20 {
		again, err := encodeMessages(msgs)
		require.NoError(t, err)
		require.Equal(t, first, again)
	}
}

func TestCodecEncodeDoesNotMutateMessages(t *testing.T) {
	t.Parallel()
	m := codecMsg("u", []byte("payload"), "k", "v")
	_, err := encodeMessages([]*message.Message{m})
	require.NoError(t, err)
	require.Equal(t, "u", m.UUID)
	require.Equal(t, []byte("payload"), []byte(m.Payload))
	require.Equal(t, message.Metadata{"k": "v"}, m.Metadata)
}

func TestCodecEncodeNilMessage(t *testing.T) {
	t.Parallel()
	for name, msgs := range map[string][]*message.Message{
		"only nil":   {nil},
		"nil second": {codecMsg("u", []byte("p")), nil},
		"nil last":   {codecMsg("u", []byte("p")), codecMsg("v", []byte("q")), nil},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			enc, err := encodeMessages(msgs)
			require.Error(t, err)
			require.Contains(t, err.Error(), "nil message at index")
			require.Contains(t, err.Error(), "index "+strconv.Itoa(len(msgs)-1))
			require.Nil(t, enc)
		})
	}
}

func TestCodecDecodeErrors(t *testing.T) {
	t.Parallel()
	valid, err := encodeMessages([]*message.Message{codecMsg("u", []byte("p"), "k", "v")})
	require.NoError(t, err)
	tests := []struct {
		name    string
		in      []byte
		wantErr error
		wantMsg string
	}{
		{name: "unknown future version", in: []byte("IMR\x02\x00"), wantMsg: "format 2"},
		{name: "version zero", in: []byte("IMR\x00\x00"), wantMsg: "format 0"},
		{name: "no magic", in: []byte(`{"v":1,"messages":[]}`), wantErr: errCorrupt},
		{name: "magic only", in: []byte("IMR"), wantErr: errCorrupt},
		{name: "garbage", in: []byte("\x00\x01garbage"), wantErr: errCorrupt},
		{name: "no count", in: []byte("IMR\x01"), wantErr: errCorrupt},
		{name: "count beyond data", in: []byte("IMR\x01\x05"), wantErr: errCorrupt},
		{name: "huge length", in: append([]byte("IMR\x01\x01"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), wantErr: errCorrupt},
		{name: "overlong varint", in: append([]byte("IMR\x01"), 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01), wantErr: errCorrupt},
		{name: "truncated", in: valid[:len(valid)-1], wantErr: errCorrupt},
		{name: "trailing data", in: append(append([]byte(nil), valid...), 0), wantErr: errCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := decodeMessages(tt.in)
			require.Error(t, err)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			}
			require.Contains(t, err.Error(), tt.wantMsg)
			require.True(t, strings.HasPrefix(err.Error(), "dedup: "), err.Error())
			require.Nil(t, got)
		})
	}
}

func TestCodecDecodeEmpty(t *testing.T) {
	t.Parallel()
	for name, in := range map[string][]byte{"nil": nil, "empty": {}} {
		got, err := decodeMessages(in)
		require.NoError(t, err, name)
		require.Nil(t, got, name)
	}
}

// Kafka headers and UUIDs are bytes: what comes back must be exactly what
// went in, not a UTF-8-repaired copy.
func TestCodecKeepsInvalidUTF8Exactly(t *testing.T) {
	t.Parallel()
	m := codecMsg("u\xff", []byte{0xfe, 0xff}, "k\xfe", "a\xffb", "trace", "\xed\xa0\x80")
	enc, err := encodeMessages([]*message.Message{m})
	require.NoError(t, err)
	got, err := decodeMessages(enc)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, m.UUID, got[0].UUID)
	require.Equal(t, m.Metadata, got[0].Metadata)
	require.Equal(t, m.Payload, got[0].Payload)
}

// FuzzDecodeMessages: decoding arbitrary bytes never panics, and whatever
// decodes re-encodes to the same messages.
func FuzzDecodeMessages(f *testing.F) {
	enc, _ := encodeMessages([]*message.Message{codecMsg("u", []byte("p"), "k", "v")})
	f.Add(enc)
	f.Add([]byte("IMR\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := decodeMessages(b)
		if err != nil {
			return
		}
		again, err := encodeMessages(msgs)
		require.NoError(t, err)
		back, err := decodeMessages(again)
		require.NoError(t, err)
		require.Equal(t, len(msgs), len(back))
		for i := range msgs {
			require.Equal(t, msgs[i].UUID, back[i].UUID)
			require.Equal(t, msgs[i].Metadata, back[i].Metadata)
			require.Equal(t, []byte(msgs[i].Payload), []byte(back[i].Payload))
		}
	})
}

// fp runs a fingerprint function, failing the test on error.
func fp(t *testing.T, f FingerprintFunc, payload string, meta ...string) []byte {
	t.Helper()
	h, err := f(codecMsg("u", []byte(payload), meta...))
	require.NoError(t, err)
	require.Len(t, h, sha256.Size)
	return h
}

func TestJSONFingerprintEquivalentPayloads(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		ignore []string
		a, b   string
	}{
		{name: "reordered keys", a: `{"a":1,"b":2,"c":3}`, b: `{"c":3,"a":1,"b":2}`},
		{name: "reordered nested keys", a: `{"o":{"x":1,"y":{"p":true,"q":null}}}`, b: `{"o":{"y":{"q":null,"p":true},"x":1}}`},
		{name: "whitespace", a: `{"a":[1,2],"b":"x"}`, b: " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\":\"x\" } \n"},
		{name: "string escapes", a: `{"a":"A\u00e9/"}`, b: `{"a":"\u0041é\/"}`},
		{name: "key escapes", a: `{"ab":1}`, b: `{"\u0061b":1}`},
		{name: "ignored root field", ignore: []string{"sent_at"}, a: `{"id":1,"sent_at":"2026-01-01"}`, b: `{"sent_at":"2026-02-02","id":1}`},
		{name: "ignored field absent on one side", ignore: []string{"sent_at"}, a: `{"id":1,"sent_at":"2026-01-01"}`, b: `{"id":1}`},
		{name: "ignored field of another type", ignore: []string{"sent_at"}, a: `{"id":1,"sent_at":"x"}`, b: `{"id":1,"sent_at":{"nested":[1]}}`},
		{name: "ignored nested field", ignore: []string{"meta.trace_id"}, a: `{"meta":{"trace_id":"a","src":"x"},"n":1}`, b: `{"n":1,"meta":{"src":"x","trace_id":"b"}}`},
		{name: "several ignored fields", ignore: []string{"sent_at", "meta.trace_id"}, a: `{"sent_at":1,"meta":{"trace_id":"a"}}`, b: `{"sent_at":2,"meta":{"trace_id":"b"}}`},
		{name: "ignore path that does not exist", ignore: []string{"nope.nope"}, a: `{"a":1}`, b: `{ "a" : 1 }`},
		{name: "identical", a: `{"a":1}`, b: `{"a":1}`},
		{name: "identical non-JSON", a: `hello`, b: `hello`},
		{name: "top-level array with whitespace", a: `[1,{"b":2,"a":1}]`, b: `[ 1, {"a":1, "b":2} ]`},
		{name: "top-level scalar with whitespace", a: `"x"`, b: ` "x" `},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := JSONFingerprint(tt.ignore...)
			require.NoError(t, err)
			require.Equal(t, fp(t, f, tt.a), fp(t, f, tt.b))
		})
	}
}

func TestJSONFingerprintDifferentPayloads(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		ignore []string
		a, b   string
	}{
		{name: "changed value", a: `{"amount":100}`, b: `{"amount":101}`},
		{name: "changed nested value", a: `{"o":{"amount":100}}`, b: `{"o":{"amount":999}}`},
		{name: "changed key", a: `{"amount":100}`, b: `{"amounts":100}`},
		{name: "extra field", a: `{"a":1}`, b: `{"a":1,"b":2}`},
		{name: "number text 1 vs 1.0", a: `{"n":1}`, b: `{"n":1.0}`},
		{name: "number text 1 vs 1e0", a: `{"n":1}`, b: `{"n":1e0}`},
		{name: "number vs string", a: `{"n":1}`, b: `{"n":"1"}`},
		{name: "null vs missing", a: `{"n":null}`, b: `{}`},
		{name: "array order", a: `{"l":[1,2]}`, b: `{"l":[2,1]}`},
		{name: "string case", a: `{"s":"abc"}`, b: `{"s":"ABC"}`},
		{name: "whitespace inside a string", a: `{"s":"a b"}`, b: `{"s":"a  b"}`},
		{name: "ignore applies at its path only", ignore: []string{"sent_at"}, a: `{"meta":{"sent_at":1}}`, b: `{"meta":{"sent_at":2}}`},
		{name: "sibling of an ignored field", ignore: []string{"meta.trace_id"}, a: `{"meta":{"trace_id":"a","src":"x"}}`, b: `{"meta":{"trace_id":"a","src":"y"}}`},
		{name: "ignore does not reach into arrays", ignore: []string{"items.x"}, a: `{"items":[{"x":1}]}`, b: `{"items":[{"x":2}]}`},
		{name: "duplicate keys are not canonicalised", a: `{"a":2}`, b: `{"a":1,"a":2}`},
		{name: "JSON vs non-JSON", a: `{"a":1}`, b: `{"a":1`},
		{name: "different non-JSON", a: `hello`, b: `hellO`},
		{name: "non-JSON whitespace matters", a: `not json`, b: `not  json`},
		{name: "empty vs JSON empty string", a: ``, b: `""`},
		{name: "empty vs whitespace", a: ``, b: ` `},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := JSONFingerprint(tt.ignore...)
			require.NoError(t, err)
			require.NotEqual(t, fp(t, f, tt.a), fp(t, f, tt.b))
		})
	}
}

func TestJSONFingerprintRawFallback(t *testing.T) {
	t.Parallel()
	f, err := JSONFingerprint()
	require.NoError(t, err)
	for _, payload := range []string{
		"",
		"not json",
		`{"a":1`,
		`{"a":1} {"b":2}`,
		`{"a":1,"a":1}`,
		"{\"a\":\"\xff\"}",
		`{"a":"\ud800"}`,
		"\x00\x01\x02",
	} {
		got := fp(t, f, payload)
		want := sha256.Sum256(append([]byte("raw\x00"), payload...))
		require.Equal(t, want[:], got, "%q is hashed raw", payload)
		raw, err := RawFingerprint(codecMsg("u", []byte(payload)))
		require.NoError(t, err)
		require.Equal(t, raw, got, "%q: a payload that is not JSON hashes as RawFingerprint does", payload)
	}
}

func TestJSONFingerprintIsDomainSeparated(t *testing.T) {
	t.Parallel()
	f, err := JSONFingerprint()
	require.NoError(t, err)
	for _, payload := range []string{`{"a":1}`, `{}`, `[]`, `1`, `"x"`, `null`, ` {"b": [true, false]} `} {
		raw, err := RawFingerprint(codecMsg("u", []byte(payload)))
		require.NoError(t, err)
		require.NotEqual(t, raw, fp(t, f, payload), "%s: the JSON and raw fingerprints of a JSON payload differ", payload)
	}
	// The canonical bytes of a JSON payload, hashed as raw bytes (as if they
	// came from a payload that failed to canonicalise), still differ from
	// the JSON hash: the domains are separated.
	jsonHash := fp(t, f, `{ "b":1, "a":2 }`)
	sameBytesRaw := sha256.Sum256(append([]byte("raw\x00"), `{"a":2,"b":1}`...))
	require.NotEqual(t, sameBytesRaw[:], jsonHash)
	want := sha256.Sum256(append([]byte("json\x00"), `{"a":2,"b":1}`...))
	require.Equal(t, want[:], jsonHash)
}

func TestFingerprintEmptyPayload(t *testing.T) {
	t.Parallel()
	f, err := JSONFingerprint("sent_at")
	require.NoError(t, err)
	for _, payload := range [][]byte{nil, {}} {
		m := message.NewMessage("u", payload)
		got, err := f(m)
		require.NoError(t, err)
		require.Len(t, got, sha256.Size)
		raw, err := RawFingerprint(m)
		require.NoError(t, err)
		require.Len(t, raw, sha256.Size)
		require.Equal(t, raw, got, "an empty payload is not JSON: hashed raw")
	}
}

func TestFingerprintIgnoresMetadataAndUUID(t *testing.T) {
	t.Parallel()
	f, err := JSONFingerprint()
	require.NoError(t, err)
	for _, fn := range []FingerprintFunc{f, RawFingerprint} {
		a, err := fn(codecMsg("uuid-a", []byte(`{"a":1}`), "event_id", "1", "sent_at", "x"))
		require.NoError(t, err)
		b, err := fn(codecMsg("uuid-b", []byte(`{"a":1}`), "event_id", "2"))
		require.NoError(t, err)
		require.Equal(t, a, b)
	}
}

func TestRawFingerprint(t *testing.T) {
	t.Parallel()
	a := fp(t, RawFingerprint, `{"a":1,"b":2}`)
	require.Equal(t, a, fp(t, RawFingerprint, `{"a":1,"b":2}`))
	require.NotEqual(t, a, fp(t, RawFingerprint, `{"b":2,"a":1}`), "RawFingerprint does not canonicalise")
	require.NotEqual(t, a, fp(t, RawFingerprint, `{"a":1, "b":2}`))
	want := sha256.Sum256([]byte("raw\x00{\"a\":1,\"b\":2}"))
	require.Equal(t, want[:], a)
}

func TestJSONFingerprintInvalidIgnorePaths(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"", ".", "a..b", ".a", "a.", "a...b"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			f, err := JSONFingerprint("ok", path)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.Contains(t, err.Error(), "ignore path")
			require.Nil(t, f)
		})
	}
}

func TestJSONFingerprintDoesNotRetainIgnoreSlice(t *testing.T) {
	t.Parallel()
	ignore := []string{"sent_at"}
	f, err := JSONFingerprint(ignore...)
	require.NoError(t, err)
	before := fp(t, f, `{"a":1,"sent_at":1}`)
	ignore[0] = "a"
	require.Equal(t, before, fp(t, f, `{"a":1,"sent_at":2}`), "changing the caller's slice later changes nothing")
}

func TestJSONFingerprintConcurrentUse(t *testing.T) {
	t.Parallel()
	f, err := JSONFingerprint("meta.trace")
	require.NoError(t, err)
	want := fp(t, f, `{"a":[1,2,{"b":"c"}],"meta":{"trace":"0"}}`)
	done := make(chan []byte)
	for i := range 8 {
		go func() {
			h, _ := f(codecMsg("u", []byte(`{"meta":{"trace":"`+strconv.Itoa(i)+`"},"a":[1,2,{"b":"c"}]}`)))
			done <- h
		}()
	}
	for range 8 {
		require.Equal(t, want, <-done)
	}
}

// TestMayBeJSONOnlySkipsWhatCanonicalizeRefuses: the fast path that hashes
// a payload raw without canonicalising it must never change a
// fingerprint, so every payload it skips is one Canonicalize refuses.
func TestMayBeJSONOnlySkipsWhatCanonicalizeRefuses(t *testing.T) {
	t.Parallel()
	payloads := [][]byte{nil, []byte(""), []byte("   "), []byte("\ufeff{}"), []byte("<xml/>"), []byte("hello"),
		[]byte("\x08\x96\x01"), []byte(" \t\n\r{\"a\":1}"), []byte("+1"), []byte(".5"), []byte("Infinity"), []byte("'x'")}
	r := mrand.New(mrand.NewPCG(1, 2))
	for range 20000 {
		p := make([]byte, 1+r.IntN(8))
		for i := range p {
			p[i] = byte(r.IntN(256))
		}
		payloads = append(payloads, p)
	}
	skipped := 0
	for _, p := range payloads {
		if mayBeJSON(p) {
			continue
		}
		skipped++
		_, err := canonjson.Canonicalize(p, nil)
		require.Error(t, err, "%q is skipped but canonicalises", p)
	}
	require.Greater(t, skipped, 15000)
	for _, p := range []string{`{}`, `[1]`, `"x"`, `-1`, `0`, `true`, `false`, `null`, "\n {}"} {
		require.True(t, mayBeJSON([]byte(p)), p)
	}
}

// BenchmarkJSONFingerprint: a JSON event, and payloads that are not JSON
// (a binary body, plain text), which hash raw.
func BenchmarkJSONFingerprint(b *testing.B) {
	f, err := JSONFingerprint("sent_at")
	require.NoError(b, err)
	bin := make([]byte, 1024)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	for _, c := range []struct {
		name    string
		payload []byte
	}{
		{"json", []byte(`{"order_id":"ord-1842","amount":{"value":"49.90","currency":"EUR"},"sent_at":"2026-12-01T10:00:00Z","items":[{"sku":"A-1","qty":2}]}`)},
		{"binary", bin},
		{"text", []byte(strings.Repeat("plain text body ", 64))},
	} {
		b.Run(c.name, func(b *testing.B) {
			msg := codecMsg("u", c.payload)
			b.ReportAllocs()
			b.SetBytes(int64(len(c.payload)))
			for b.Loop() {
				if _, err := f(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
