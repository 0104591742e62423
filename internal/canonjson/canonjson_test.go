package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestCanonicalize(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		ignore []Path
		want   string
	}{
		{"key order", `{"b":1,"a":2,"c":3}`, nil, `{"a":2,"b":1,"c":3}`},
		{"already sorted", `{"a":1,"b":2}`, nil, `{"a":1,"b":2}`},
		{"key prefix sorts first", `{"ab":1,"a":2,"":3}`, nil, `{"":3,"a":2,"ab":1}`},
		{"bytewise not case-folded", `{"b":1,"B":2,"a":3,"A":4}`, nil, `{"A":4,"B":2,"a":3,"b":1}`},
		{"nested objects", `{"z":{"y":1,"x":{"b":true,"a":false}},"a":null}`, nil,
			`{"a":null,"z":{"x":{"a":false,"b":true},"y":1}}`},
		{"objects inside arrays sorted", `[{"b":1,"a":2},{"d":3,"c":4}]`, nil, `[{"a":2,"b":1},{"c":4,"d":3}]`},
		{"whitespace", " \t\r\n{ \"b\" :\n[ 1 , 2 ]\t, \"a\"\r: { } } \n", nil, `{"a":{},"b":[1,2]}`},
		{"empty object", `{}`, nil, `{}`},
		{"empty object with space", `{ }`, nil, `{}`},
		{"empty array", `[ ]`, nil, `[]`},
		{"empty containers nested", `{"a":[],"b":{},"c":[{}]}`, nil, `{"a":[],"b":{},"c":[{}]}`},
		{"scalar top level", ` "x" `, nil, `"x"`},
		{"literals", `[true,false,null]`, nil, `[true,false,null]`},
		{"arrays keep order", `[3,1,2,"b","a",[2,1]]`, nil, `[3,1,2,"b","a",[2,1]]`},

		// Numbers are never normalised.
		{"numbers verbatim", `[1,1.0,1e0,1E0,1e+0,1e-0,10e-1,-0,0.0,-0.5e10]`, nil, `[1,1.0,1e0,1E0,1e+0,1e-0,10e-1,-0,0.0,-0.5e10]`},
		{"big numbers verbatim", `[123456789012345678901234567890,1e400,0.1000000000000000000001]`, nil,
			`[123456789012345678901234567890,1e400,0.1000000000000000000001]`},

		// Strings are re-encoded one fixed way.
		{"unicode escape of ASCII", `"\u0041"`, nil, `"A"`},
		{"solidus", `"a\/b"`, nil, `"a/b"`},
		{"short escapes kept", `"\"\\\b\f\n\r\t"`, nil, `"\"\\\b\f\n\r\t"`},
		{"short escapes from \\u", `"\u0022\u005c\u0008\u000c\u000a\u000d\u0009"`, nil, `"\"\\\b\f\n\r\t"`},
		{"other controls lowercase hex", `"\u0000\u001F\u001b\u007f"`, nil, "\"\\u0000\\u001f\\u001b\x7f\""},
		{"html and line separators literal", `"\u003c\u003e\u0026\u2028\u2029"`, nil, "\"<>&\u2028\u2029\""},
		{"non-ASCII literal", `"\u00e9\u00C9 é"`, nil, `"éÉ é"`},
		{"surrogate pair", `"\ud83d\ude00 \uD83D\uDE00"`, nil, `"😀 😀"`},
		{"escape then plain tail", `"a\nb\u00e9c"`, nil, `"a\nbéc"`},
		{"escaped keys", `{"\u0062":1,"\u0061":2}`, nil, `{"a":2,"b":1}`},
		{"escaped key sorts by unescaped bytes", `{"\"":1,"#":2,"!":3}`, nil, `{"!":3,"\"":1,"#":2}`},
		{"unicode keys ordering", `{"é":1,"z":2,"\u00e8":3,"😀":4,"\uffff":5,"A":6}`, nil,
			"{\"A\":6,\"z\":2,\"è\":3,\"é\":1,\"\uffff\":5,\"😀\":4}"},

		// Ignored paths.
		{"ignore top level", `{"b":1,"sent_at":"x","a":2}`, []Path{{"sent_at"}}, `{"a":2,"b":1}`},
		{"ignore first member", `{"a":1,"b":2}`, []Path{{"a"}}, `{"b":2}`},
		{"ignore last member", `{"a":1,"b":2}`, []Path{{"b"}}, `{"a":1}`},
		{"ignore only member", `{"a":{"x":1}}`, []Path{{"a"}}, `{}`},
		{"ignore all members", `{"b":1,"a":2}`, []Path{{"a"}, {"b"}}, `{}`},
		{"ignore nested", `{"meta":{"trace":"t","sent_at":"x"},"id":1}`, []Path{{"meta", "sent_at"}},
			`{"id":1,"meta":{"trace":"t"}}`},
		{"ignore deep nested", `{"a":{"b":{"c":1,"d":2}}}`, []Path{{"a", "b", "c"}}, `{"a":{"b":{"d":2}}}`},
		{"ignore matches unescaped key", `{"sent\u005fat":1,"a":2}`, []Path{{"sent_at"}}, `{"a":2}`},
		{"ignore only at its path", `{"x":{"sent_at":1},"sent_at":2}`, []Path{{"sent_at"}}, `{"x":{"sent_at":1}}`},
		{"ignore missing path", `{"a":1}`, []Path{{"b"}, {"a", "x"}, {"c", "d", "e"}}, `{"a":1}`},
		{"ignore through scalar", `{"meta":5}`, []Path{{"meta", "sent_at"}}, `{"meta":5}`},
		{"ignore through array", `{"meta":[{"sent_at":1}]}`, []Path{{"meta", "sent_at"}}, `{"meta":[{"sent_at":1}]}`},
		{"ignore does not apply in arrays", `[{"sent_at":1}]`, []Path{{"sent_at"}}, `[{"sent_at":1}]`},
		{"ignore on scalar root", `"sent_at"`, []Path{{"sent_at"}}, `"sent_at"`},
		{"ignore parent and child", `{"m":{"a":1},"b":2}`, []Path{{"m", "a"}, {"m"}}, `{"b":2}`},
		{"ignore same path twice", `{"m":1,"b":2}`, []Path{{"m"}, {"m"}}, `{"b":2}`},
		{"ignore empty key", `{"":1,"a":{"":2,"b":3}}`, []Path{{"a", ""}}, `{"":1,"a":{"b":3}}`},
		{"ignore in unsorted object", `{"c":1,"b":2,"a":3}`, []Path{{"b"}}, `{"a":3,"c":1}`},
		{"ignore nested in unsorted", `{"z":0,"m":{"y":1,"t":2,"x":3}}`, []Path{{"m", "t"}}, `{"m":{"x":3,"y":1},"z":0}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(tt.in), tt.ignore)
			if err != nil {
				t.Fatalf("Canonicalize(%q) error: %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Fatalf("Canonicalize(%q)\n got %s\nwant %s", tt.in, got, tt.want)
			}
			checkCanonicalize(t, []byte(tt.in), tt.ignore)
		})
	}
}

func TestCanonicalizeEquivalentInputs(t *testing.T) {
	// Each group must canonicalise to one value.
	groups := [][]string{
		{`{"a":"A","b":[1,2]}`, ` { "b" : [ 1 , 2 ] , "a" : "\u0041" } `, `{"\u0062":[1,2],"\u0061":"\u0041"}`},
		{`"é/<"`, `"\u00e9\/\u003c"`, `"\u00E9\u002F<"`},
		{`{"meta":{"sent_at":1,"k":2}}`, `{"meta":{"k":2,"sent_at":99}}`, `{"meta":{"k":2}}`},
	}
	ignore := []Path{{"meta", "sent_at"}}
	for _, g := range groups {
		first, err := Canonicalize([]byte(g[0]), ignore)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range g[1:] {
			got, err := Canonicalize([]byte(in), ignore)
			if err != nil || !bytes.Equal(got, first) {
				t.Errorf("Canonicalize(%q) = %s, %v; want %s like %q", in, got, err, first, g[0])
			}
		}
	}
	// And these must not be merged.
	distinct := []string{`1`, `1.0`, `1e0`, `"1"`, `[1]`, `{"a":1}`, `{"a":1.0}`, `{"a":[1,2]}`, `{"a":[2,1]}`, `"A"`, `"a"`}
	seen := map[string]string{}
	for _, in := range distinct {
		got, err := Canonicalize([]byte(in), nil)
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := seen[string(got)]; ok {
			t.Errorf("%q and %q canonicalise to the same %s", prev, in, got)
		}
		seen[string(got)] = in
	}
}

func TestCanonicalizeRefuses(t *testing.T) {
	tests := []struct{ name, in string }{
		{"empty input", ``},
		{"only whitespace", " \n\t "},
		{"invalid UTF-8 in string", "\"\xff\""},
		{"invalid UTF-8 in key", "{\"\xc3\":1}"},
		{"invalid UTF-8 outside value", "{}\xff"},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\""},
		{"overlong UTF-8", "\"\xc0\xaf\""},
		{"byte order mark", "\ufeff{}"},
		{"two values", `{} {}`},
		{"trailing garbage", `{"a":1}x`},
		{"trailing comma in array", `[1,]`},
		{"trailing comma in object", `{"a":1,}`},
		{"leading comma", `[,1]`},
		{"missing comma", `[1 2]`},
		{"missing colon", `{"a" 1}`},
		{"missing value", `{"a":}`},
		{"non-string key", `{1:2}`},
		{"single-quoted string", `{'a':1}`},
		{"unterminated object", `{"a":1`},
		{"unterminated array", `[1,2`},
		{"unterminated string", `"abc`},
		{"unterminated escaped string", `"a\n`},
		{"lone backslash at end", `"\`},
		{"mismatched brackets", `[1}`},
		{"unopened close", `]`},
		{"raw newline in string", "\"a\nb\""},
		{"raw tab in string", "\"a\tb\""},
		{"raw NUL in escaped string", "\"\\n\x00\""},
		{"invalid escape", `"\x41"`},
		{"invalid escape upper U", `"\U0041"`},
		{"short \\u escape", `"\u41"`},
		{"non-hex \\u escape", `"\u00g1"`},
		{"lone high surrogate", `"\ud800"`},
		{"lone high surrogate then text", `"\ud800abcdef"`},
		{"high surrogate then non-surrogate", `"\ud800\u0041"`},
		{"two high surrogates", `"\ud800\ud800"`},
		{"lone low surrogate", `"\udc00"`},
		{"reversed surrogates", `"\udc00\ud800"`},
		{"two low surrogates", `"\udc00\udc00"`},
		{"high surrogate then short escape", `"\ud800\n"`},
		{"truncated pair", `"\ud800\udc`},
		{"leading zero", `01`},
		{"negative leading zero", `-01`},
		{"plus sign", `+1`},
		{"lone minus", `-`},
		{"leading dot", `.5`},
		{"trailing dot", `1.`},
		{"empty exponent", `1e`},
		{"signed empty exponent", `1e+`},
		{"hex number", `0x10`},
		{"NaN", `NaN`},
		{"Infinity", `-Infinity`},
		{"number then letters", `1true`},
		{"truncated literal", `tru`},
		{"misspelled literal", `nul1`},
		{"capitalised literal", `True`},
		{"literal with suffix", `nullx`},
		{"duplicate key", `{"a":1,"a":1}`},
		{"duplicate key unsorted", `{"b":1,"a":2,"b":3}`},
		{"duplicate key after unescaping", `{"a":1,"\u0061":2}`},
		{"duplicate nested key", `{"x":{"k":1,"k":2}}`},
		{"duplicate key in array element", `[{"k":1,"k":2}]`},
		{"comment", `{"a":1 /* c */}`},
		{"vertical tab whitespace", "\v1"},
		{"non-breaking space whitespace", "\u00a01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(tt.in), nil)
			if err == nil {
				t.Fatalf("Canonicalize(%q) = %q, want an error", tt.in, got)
			}
			if !errors.Is(err, ErrNotCanonicalizable) {
				t.Fatalf("Canonicalize(%q) error %v does not wrap ErrNotCanonicalizable", tt.in, err)
			}
			if got != nil {
				t.Fatalf("Canonicalize(%q) returned output %q with an error", tt.in, got)
			}
			checkCanonicalize(t, []byte(tt.in), nil)
		})
	}
}

func TestIgnoredMembersStillValidated(t *testing.T) {
	ignore := []Path{{"meta"}, {"a"}}
	for _, in := range []string{
		`{"meta":{"x":1,"x":2}}`,        // duplicate inside an ignored value
		`{"meta":[1,]}`,                 // syntax error inside an ignored value
		`{"meta":"\ud800"}`,             // lone surrogate inside an ignored value
		`{"meta":1,"meta":2}`,           // the ignored key itself is duplicated
		`{"a":1,"b":2,"\u0061":3}`,      // ditto, after unescaping
		"{\"meta\":\"\xff\"}",           // invalid UTF-8 inside an ignored value
		`{"meta":` + nested(1000) + `}`, // too deep inside an ignored value
	} {
		if got, err := Canonicalize([]byte(in), ignore); !errors.Is(err, ErrNotCanonicalizable) {
			t.Errorf("Canonicalize(%q) = %q, %v; want refusal", in, got, err)
		}
	}
}

// nested returns n nested arrays around 0, alternating with objects so both
// container kinds count towards the limit.
func nested(n int) string {
	var open, close strings.Builder
	for i := range n {
		if i%2 == 0 {
			open.WriteString(`[`)
		} else {
			open.WriteString(`{"k":`)
		}
	}
	for i := n - 1; i >= 0; i-- {
		if i%2 == 0 {
			close.WriteString(`]`)
		} else {
			close.WriteString(`}`)
		}
	}
	return open.String() + "0" + close.String()
}

func TestDepthLimit(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{nested(1), true},
		{nested(maxDepth), true},
		{nested(maxDepth + 1), false},
		{strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth), true},
		{strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1), false},
		{strings.Repeat(`{"a":`, maxDepth) + "1" + strings.Repeat("}", maxDepth), true},
		{strings.Repeat(`{"a":`, maxDepth+1) + "1" + strings.Repeat("}", maxDepth+1), false},
		// Deep and unterminated: must fail without blowing the stack.
		{strings.Repeat("[", 1<<20), false},
		{strings.Repeat(`{"a":`, 1<<18), false},
	} {
		got, err := Canonicalize([]byte(tc.in), nil)
		if tc.ok {
			if err != nil || string(got) != tc.in {
				t.Errorf("Canonicalize(%.40q...) = %.40q, %v; want it unchanged", tc.in, got, err)
			}
		} else if !errors.Is(err, ErrNotCanonicalizable) {
			t.Errorf("Canonicalize(%.40q...) = %.40q, %v; want refusal", tc.in, got, err)
		}
	}
	// Deep nesting through an ignore path also works.
	deep := strings.Repeat(`{"a":`, maxDepth) + "1" + strings.Repeat("}", maxDepth)
	path := slices.Repeat(Path{"a"}, maxDepth)
	got, err := Canonicalize([]byte(deep), []Path{path})
	want := strings.Repeat(`{"a":`, maxDepth-1) + "{}" + strings.Repeat("}", maxDepth-1)
	if err != nil || string(got) != want {
		t.Errorf("deep ignore: got %.60q..., %v", got, err)
	}
}

func TestEmptyIgnorePath(t *testing.T) {
	_, err := Canonicalize([]byte(`{"a":1}`), []Path{{"a"}, {}})
	if err == nil || errors.Is(err, ErrNotCanonicalizable) {
		t.Fatalf("zero-length ignore path: err = %v, want a caller error not wrapping ErrNotCanonicalizable", err)
	}
}

func TestCanonicalizeDoesNotModifyInput(t *testing.T) {
	in := []byte(`{"b":{"y":"\u00e9","x":1},"a":[3,2,1],"m":{"s":1}}`)
	orig := bytes.Clone(in)
	if _, err := Canonicalize(in, []Path{{"m", "s"}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, orig) {
		t.Fatalf("input modified: %q", in)
	}
}

func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Path
	}{
		{"sent_at", Path{"sent_at"}},
		{"meta.sent_at", Path{"meta", "sent_at"}},
		{"a.b.c", Path{"a", "b", "c"}},
		{"é.ü", Path{"é", "ü"}},
	} {
		got, err := ParsePath(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParsePath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", ".", "a.", ".a", "a..b"} {
		if got, err := ParsePath(in); err == nil {
			t.Errorf("ParsePath(%q) = %q, want an error", in, got)
		}
	}
}

// TestProperties checks randomly generated valid documents, written with
// random whitespace, escapes and key order, against the encoding/json
// oracle in oracle_test.go.
func TestProperties(t *testing.T) {
	n := 3000
	if testing.Short() {
		n = 300
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		g := &gen{rng: rng}
		g.value(0)
		in := g.buf.Bytes()
		ignore := g.ignorePaths()
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			out, err := Canonicalize(in, ignore)
			if err != nil {
				t.Fatalf("Canonicalize(%q, %q) refused valid input: %v", in, ignore, err)
			}
			checkCanonicalize(t, in, ignore)

			// Re-serialising the same data differently must not change
			// the canonical form.
			g2 := &gen{rng: rng}
			v, err := decodeUseNumber(in)
			if err != nil {
				t.Fatal(err)
			}
			g2.encode(v)
			out2, err := Canonicalize(g2.buf.Bytes(), ignore)
			if err != nil || !bytes.Equal(out, out2) {
				t.Fatalf("same data, different canonical forms:\n%q -> %q\n%q -> %q (%v)", in, out, g2.buf.Bytes(), out2, err)
			}
		})
	}
}

// TestPropertiesDuplicates injects a duplicate key into generated objects
// and checks that it is always refused.
func TestPropertiesDuplicates(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		g := &gen{rng: rng}
		g.buf.WriteByte('{')
		g.str("k")
		g.buf.WriteString(":1,")
		g.value(1)
		g.buf.WriteByte(',')
		g.str("k") // possibly escaped differently
		g.buf.WriteString(":1}")
		in := g.buf.Bytes()
		if out, err := Canonicalize(in, []Path{{"k"}}); !errors.Is(err, ErrNotCanonicalizable) {
			t.Fatalf("Canonicalize(%q) = %q, %v; want refusal of duplicate key", in, out, err)
		}
	}
}

// gen writes random valid JSON documents.
type gen struct {
	rng  *rand.Rand
	buf  bytes.Buffer
	keys []string // every key used, for picking ignore paths
}

var (
	genKeys    = []string{"a", "b", "c", "A", "ab", "", "meta", "sent_at", "id", "é", "e\u0301", "😀", "\u2028", "k\"q", "back\\slash", "tab\t", "nul\x00", "\x7f", "\uffff", "z"}
	genStrings = []string{"", "x", "hello world", "<script>&amp;</script>", "line\nbreak", "quote\"", "\\", "\u00e9\u00e8", "日本語", "😀👍", "\u2028\u2029", "\x00\x01\x1f", "\b\f\n\r\t", "/path/to", "\ufffd", "\x7f\u0080\u07ff\u0800\uffff\U00010000\U0010ffff"}
	genNumbers = []string{"0", "-0", "1", "-1", "1.0", "1e0", "1E+2", "1e-2", "123456789012345678901234567890", "0.000001", "-12.5e-300", "1e400", "3.14159", "10", "100e-2"}
)

func (g *gen) space() {
	for g.rng.IntN(4) == 0 {
		g.buf.WriteByte(" \t\r\n"[g.rng.IntN(4)])
	}
}

func (g *gen) value(depth int) {
	g.space()
	k := g.rng.IntN(10)
	if depth > 5 {
		k = g.rng.IntN(6)
	}
	switch k {
	case 0:
		g.buf.WriteString([]string{"true", "false", "null"}[g.rng.IntN(3)])
	case 1, 2:
		g.buf.WriteString(genNumbers[g.rng.IntN(len(genNumbers))])
	case 3, 4, 5:
		g.str(genStrings[g.rng.IntN(len(genStrings))])
	case 6, 7:
		g.buf.WriteByte('[')
		g.space()
		for i := range g.rng.IntN(5) {
			if i > 0 {
				g.buf.WriteByte(',')
			}
			g.value(depth + 1)
		}
		g.space()
		g.buf.WriteByte(']')
	default:
		g.buf.WriteByte('{')
		g.space()
		keys := slices.Clone(genKeys)
		g.rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for i, key := range keys[:g.rng.IntN(7)] {
			if i > 0 {
				g.buf.WriteByte(',')
			}
			g.space()
			g.str(key)
			g.keys = append(g.keys, key)
			g.space()
			g.buf.WriteByte(':')
			g.value(depth + 1)
			g.space()
		}
		g.buf.WriteByte('}')
	}
	g.space()
}

// str writes s as a JSON string, escaping each character in a randomly
// chosen valid way.
func (g *gen) str(s string) {
	g.buf.WriteByte('"')
	for _, r := range s {
		mustEscape := r < 0x20 || r == '"' || r == '\\'
		switch choice := g.rng.IntN(4); {
		case choice == 0 || (mustEscape && choice == 1):
			if r > 0xffff {
				r1, r2 := surrogates(r)
				fmt.Fprintf(&g.buf, `\u%04x\u%04X`, r1, r2)
			} else if g.rng.IntN(2) == 0 {
				fmt.Fprintf(&g.buf, `\u%04x`, r)
			} else {
				fmt.Fprintf(&g.buf, `\u%04X`, r)
			}
		case mustEscape || (r == '/' && choice == 1):
			switch r {
			case '"', '\\', '/':
				g.buf.WriteByte('\\')
				g.buf.WriteRune(r)
			case '\b':
				g.buf.WriteString(`\b`)
			case '\f':
				g.buf.WriteString(`\f`)
			case '\n':
				g.buf.WriteString(`\n`)
			case '\r':
				g.buf.WriteString(`\r`)
			case '\t':
				g.buf.WriteString(`\t`)
			default:
				fmt.Fprintf(&g.buf, `\u%04x`, r)
			}
		default:
			g.buf.WriteRune(r)
		}
	}
	g.buf.WriteByte('"')
}

func surrogates(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

// encode writes an already decoded value with fresh random formatting and
// member order.
func (g *gen) encode(v any) {
	g.space()
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v { // random map order is fine here
			keys = append(keys, k)
		}
		g.buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				g.buf.WriteByte(',')
			}
			g.str(k)
			g.space()
			g.buf.WriteByte(':')
			g.encode(v[k])
		}
		g.buf.WriteByte('}')
	case []any:
		g.buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				g.buf.WriteByte(',')
			}
			g.encode(e)
		}
		g.buf.WriteByte(']')
	case string:
		g.str(v)
	default:
		b, _ := json.Marshal(v)
		g.buf.Write(b)
	}
	g.space()
}

// ignorePaths picks a few paths out of the keys used in the document, so
// that they often match.
func (g *gen) ignorePaths() []Path {
	var paths []Path
	for range g.rng.IntN(4) {
		var p Path
		for range 1 + g.rng.IntN(3) {
			if len(g.keys) > 0 && g.rng.IntN(4) != 0 {
				p = append(p, g.keys[g.rng.IntN(len(g.keys))])
			} else {
				p = append(p, genKeys[g.rng.IntN(len(genKeys))])
			}
		}
		paths = append(paths, p)
	}
	return paths
}

// TestConcurrentUse exercises the parser pool: calls that fail half-way
// (leaving state behind) interleaved with successful ones, from several
// goroutines, must not influence each other.
func TestConcurrentUse(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{`{"b":{"y":1,"x":"\u0041"},"a":[{"d":1,"c":2}]}`, `{"a":[{"c":2,"d":1}],"b":{"x":"A","y":1}}`, true},
		{`{"b":{"y":1,"x":{"q":[1,{"z":1,"z":2}]}}}`, ``, false},
		{`{"z":{"\u0079":1,"x":{"q":[1,{"z":1,`, ``, false},
		{`{"m":{"sent_at":1,"k":"v"},"a":1}`, `{"a":1,"m":{"k":"v"}}`, true},
	}
	ignore := []Path{{"m", "sent_at"}}
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 2000 {
				c := cases[(g+i)%len(cases)]
				got, err := Canonicalize([]byte(c.in), ignore)
				if (err == nil) != c.ok || string(got) != c.want {
					t.Errorf("Canonicalize(%q) = %q, %v; want %q", c.in, got, err, c.want)
					return
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
}
