package dedup_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/inboxmill/inboxmill/dedup"
)

// keyMsg builds a message with the given payload and metadata pairs.
func keyMsg(payload string, meta ...string) *message.Message {
	msg := message.NewMessage("uuid-1", []byte(payload))
	for i := 0; i+1 < len(meta); i += 2 {
		msg.Metadata.Set(meta[i], meta[i+1])
	}
	return msg
}

// requireKeyError asserts that err is a *dedup.KeyError for part that wraps
// want.
func requireKeyError(t *testing.T, err error, part string, want error) *dedup.KeyError {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, want)
	var ke *dedup.KeyError
	require.ErrorAs(t, err, &ke)
	require.Equal(t, part, ke.Part)
	require.ErrorIs(t, ke.Err, want)
	require.True(t, dedup.IsPoison(err), "a key error is poison: %v", err)
	require.False(t, dedup.IsRetryable(err), "a key error is not retryable: %v", err)
	return ke
}

func TestKeyFromMetadata(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		msg     *message.Message
		want    string
		wantErr error
	}{
		{name: "present", msg: keyMsg(`{}`, "event_id", "evt-1"), want: "evt-1"},
		{name: "whitespace is kept", msg: keyMsg(`{}`, "event_id", " evt-1 "), want: " evt-1 "},
		{name: "payload is irrelevant", msg: keyMsg("not json", "event_id", "evt-2"), want: "evt-2"},
		{name: "missing", msg: keyMsg(`{}`, "other", "evt-1"), wantErr: dedup.ErrMissingKey},
		{name: "empty", msg: keyMsg(`{}`, "event_id", ""), wantErr: dedup.ErrMissingKey},
		{name: "no metadata at all", msg: keyMsg(`{}`), wantErr: dedup.ErrMissingKey},
		{name: "nil metadata map", msg: &message.Message{UUID: "u", Payload: []byte(`{}`)}, wantErr: dedup.ErrMissingKey},
		{name: "field name is case-sensitive", msg: keyMsg(`{}`, "Event_ID", "evt-1"), wantErr: dedup.ErrMissingKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := dedup.KeyFromMetadata("event_id")(tt.msg)
			if tt.wantErr != nil {
				ke := requireKeyError(t, err, "key", tt.wantErr)
				require.Equal(t, `metadata "event_id"`, ke.Source)
				require.Equal(t, `dedup: key from metadata "event_id": `+tt.wantErr.Error(), err.Error())
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestKeyFromJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		path    string
		payload string
		want    string
		wantErr error
	}{
		// Values that make a key.
		{name: "string", path: "id", payload: `{"id":"evt-1"}`, want: "evt-1"},
		{name: "nested string", path: "data.object.id", payload: `{"data":{"object":{"id":"ch_1","amount":5}},"id":"top"}`, want: "ch_1"},
		{name: "integer is its literal text", path: "id", payload: `{"id":12345}`, want: "12345"},
		{name: "negative exponent number is its literal text", path: "id", payload: `{"id":-1.5e3}`, want: "-1.5e3"},
		{name: "nested number", path: "data.object.id", payload: `{"data":{"object":{"id":0.10}}}`, want: "0.10"},
		{name: "big integer keeps all digits", path: "id", payload: `{"id":123456789012345678901234567890}`, want: "123456789012345678901234567890"},
		{name: "number surrounded by whitespace", path: "id", payload: "{\"id\" :\n\t 42 \n}", want: "42"},
		{name: "escaped string is unescaped", path: "id", payload: `{"id":"\u0041bc"}`, want: "Abc"},
		{name: "escaped quote and slash", path: "id", payload: `{"id":"a\"b\/c"}`, want: `a"b/c`},
		{name: "non-ASCII string", path: "id", payload: `{"id":"évènement-1"}`, want: "évènement-1"},
		{name: "other fields of any type are ignored", path: "id", payload: `{"x":[1,{"y":null}],"id":"k","z":true}`, want: "k"},
		{name: "whitespace-only string is a key", path: "id", payload: `{"id":" "}`, want: " "},

		// No key.
		{name: "null", path: "id", payload: `{"id":null}`, wantErr: dedup.ErrMissingKey},
		{name: "nested null", path: "data.object.id", payload: `{"data":{"object":{"id":null}}}`, wantErr: dedup.ErrMissingKey},
		{name: "empty string", path: "id", payload: `{"id":""}`, wantErr: dedup.ErrMissingKey},
		{name: "missing field", path: "id", payload: `{"ID":"evt-1","other":"x"}`, wantErr: dedup.ErrMissingKey},
		{name: "missing nested field", path: "data.object.id", payload: `{"data":{"object":{"name":"x"}}}`, wantErr: dedup.ErrMissingKey},
		{name: "missing intermediate", path: "data.object.id", payload: `{"data":{}}`, wantErr: dedup.ErrMissingKey},
		{name: "empty object", path: "id", payload: `{}`, wantErr: dedup.ErrMissingKey},
		{name: "payload not JSON", path: "id", payload: `id=evt-1`, wantErr: dedup.ErrMissingKey},
		{name: "payload truncated JSON", path: "id", payload: `{"id":"evt-1"`, wantErr: dedup.ErrMissingKey},
		{name: "payload empty", path: "id", payload: ``, wantErr: dedup.ErrMissingKey},
		{name: "payload JSON null", path: "id", payload: `null`, wantErr: dedup.ErrMissingKey},
		{name: "payload JSON array", path: "id", payload: `[{"id":"evt-1"}]`, wantErr: dedup.ErrMissingKey},
		{name: "payload JSON string", path: "id", payload: `"evt-1"`, wantErr: dedup.ErrMissingKey},
		{name: "payload JSON number", path: "id", payload: `1`, wantErr: dedup.ErrMissingKey},
		{name: "intermediate is a string", path: "data.object.id", payload: `{"data":"x"}`, wantErr: dedup.ErrMissingKey},
		{name: "intermediate is a number", path: "data.object.id", payload: `{"data":{"object":7}}`, wantErr: dedup.ErrMissingKey},
		{name: "intermediate is an array", path: "data.object.id", payload: `{"data":[{"object":{"id":"x"}}]}`, wantErr: dedup.ErrMissingKey},
		{name: "intermediate is null", path: "data.object.id", payload: `{"data":null}`, wantErr: dedup.ErrMissingKey},

		// A field of the wrong type.
		{name: "boolean true", path: "id", payload: `{"id":true}`, wantErr: dedup.ErrInvalidKey},
		{name: "boolean false", path: "id", payload: `{"id":false}`, wantErr: dedup.ErrInvalidKey},
		{name: "object", path: "id", payload: `{"id":{"v":"evt-1"}}`, wantErr: dedup.ErrInvalidKey},
		{name: "empty object value", path: "id", payload: `{"id":{}}`, wantErr: dedup.ErrInvalidKey},
		{name: "array", path: "id", payload: `{"id":["evt-1"]}`, wantErr: dedup.ErrInvalidKey},
		{name: "nested boolean", path: "data.object.id", payload: `{"data":{"object":{"id":true}}}`, wantErr: dedup.ErrInvalidKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := dedup.KeyFromJSON(tt.path)(keyMsg(tt.payload, "event_id", "from-metadata"))
			if tt.wantErr != nil {
				ke := requireKeyError(t, err, "key", tt.wantErr)
				require.Equal(t, `JSON field "`+tt.path+`"`, ke.Source)
				require.Empty(t, got)
				if errors.Is(tt.wantErr, dedup.ErrMissingKey) {
					require.NotErrorIs(t, err, dedup.ErrInvalidKey)
				} else {
					require.NotErrorIs(t, err, dedup.ErrMissingKey)
				}
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestKeyFromJSONErrorsNameThePathNotTheValue(t *testing.T) {
	t.Parallel()
	_, err := dedup.KeyFromJSON("data.object.id")(keyMsg(`{"data":"secret-value-77"}`))
	require.ErrorIs(t, err, dedup.ErrMissingKey)
	require.Contains(t, err.Error(), `"data" is not an object`)
	require.NotContains(t, err.Error(), "secret-value-77")

	_, err = dedup.KeyFromJSON("id")(keyMsg(`{"id":{"secret":"secret-value-77"}}`))
	require.ErrorIs(t, err, dedup.ErrInvalidKey)
	require.NotContains(t, err.Error(), "secret-value-77")
}

func TestKeyFromFunc(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("lookup failed")
	wrapped := &dedup.KeyError{Part: "key", Source: "custom", Err: dedup.ErrInvalidKey}
	tests := []struct {
		name    string
		f       func(*message.Message) (string, error)
		want    string
		wantErr error
		// passthrough: the error must be the very value f returned.
		passthrough bool
	}{
		{name: "value", f: func(m *message.Message) (string, error) { return "k-" + m.Metadata.Get("n"), nil }, want: "k-7"},
		{name: "error is passed through", f: func(*message.Message) (string, error) { return "", sentinel }, wantErr: sentinel, passthrough: true},
		{name: "error wins over a value", f: func(*message.Message) (string, error) { return "ignored", sentinel }, wantErr: sentinel, passthrough: true},
		{name: "key error is passed through", f: func(*message.Message) (string, error) { return "", wrapped }, wantErr: dedup.ErrInvalidKey, passthrough: true},
		{name: "empty result is a missing key", f: func(*message.Message) (string, error) { return "", nil }, wantErr: dedup.ErrMissingKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := dedup.KeyFromFunc(tt.f)(keyMsg(`{}`, "n", "7"))
			switch {
			case tt.passthrough:
				require.ErrorIs(t, err, tt.wantErr)
				_, want := tt.f(nil)
				require.Same(t, want, err, "the function's error is returned as is")
				require.Empty(t, got)
			case tt.wantErr != nil:
				ke := requireKeyError(t, err, "key", tt.wantErr)
				require.Equal(t, "key function", ke.Source)
				require.Empty(t, got)
			default:
				require.NoError(t, err)
				require.Equal(t, tt.want, got)
			}
		})
	}
}

func TestScopeFromMetadata(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		msg     *message.Message
		want    string
		wantErr bool
	}{
		{name: "present", msg: keyMsg(`{}`, "tenant_id", "acme"), want: "acme"},
		{name: "missing", msg: keyMsg(`{}`, "event_id", "evt-1"), wantErr: true},
		{name: "empty", msg: keyMsg(`{}`, "tenant_id", ""), wantErr: true},
		{name: "nil metadata map", msg: &message.Message{UUID: "u"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := dedup.ScopeFromMetadata("tenant_id")(tt.msg)
			if tt.wantErr {
				ke := requireKeyError(t, err, "scope", dedup.ErrMissingKey)
				require.Equal(t, `metadata "tenant_id"`, ke.Source)
				require.Equal(t, `dedup: scope from metadata "tenant_id": `+dedup.ErrMissingKey.Error(), err.Error())
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestScopeConstant(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{"", "acme", "tenant with spaces"} {
		f := dedup.ScopeConstant(scope)
		for _, msg := range []*message.Message{keyMsg(`{}`), keyMsg("x", "tenant_id", "other"), {}} {
			got, err := f(msg)
			require.NoError(t, err)
			require.Equal(t, scope, got)
		}
	}
}

func TestKeyErrorUnwrapsItsCause(t *testing.T) {
	t.Parallel()
	cause := errors.New("cause")
	ke := &dedup.KeyError{Part: "key", Source: "somewhere", Err: cause}
	require.ErrorIs(t, ke, cause)
	require.Equal(t, "dedup: key from somewhere: cause", ke.Error())
	require.False(t, dedup.IsPoison(ke), "only ErrMissingKey/ErrInvalidKey causes are poison")
}

// encoding/json folds invalid UTF-8 and lone surrogates into U+FFFD; keys
// that differ only there must not become one key.
func TestKeyFromJSONRefusesUnrepresentableStrings(t *testing.T) {
	t.Parallel()
	key := dedup.KeyFromJSON("id")
	for _, payload := range []string{"{\"id\":\"a\xffb\"}", "{\"id\":\"a\xfeb\"}", `{"id":"\ud800"}`, `{"id":"\udfff"}`} {
		_, err := key(message.NewMessage("u", []byte(payload)))
		require.ErrorIs(t, err, dedup.ErrInvalidKey, payload)
	}
}
