package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"testing"
	"unicode/utf8"
)

// This file holds the independent oracle the property tests and the fuzz
// target check Canonicalize against. It is built on encoding/json and shares
// no code with the parser.

// decodeUseNumber decodes exactly one JSON value with UseNumber, so that
// numbers compare by their literal text, as the canonical form keeps them.
func decodeUseNumber(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after value (%v)", err)
	}
	return v, nil
}

// removePaths deletes the members named by ignore from v, following paths
// through maps only, like Canonicalize.
func removePaths(v any, ignore []Path) any {
	for _, path := range ignore {
		cur := v
		for i, seg := range path {
			m, ok := cur.(map[string]any)
			if !ok {
				break
			}
			if i == len(path)-1 {
				delete(m, seg)
				break
			}
			cur = m[seg]
		}
	}
	return v
}

// referenceCanonical encodes a value decoded by decodeUseNumber following the
// documented canonical rules, written as plainly as possible.
func referenceCanonical(v any) []byte {
	var buf bytes.Buffer
	var enc func(v any)
	enc = func(v any) {
		switch v := v.(type) {
		case nil:
			buf.WriteString("null")
		case bool:
			fmt.Fprint(&buf, v)
		case json.Number:
			buf.WriteString(string(v))
		case string:
			referenceString(&buf, v)
		case []any:
			buf.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					buf.WriteByte(',')
				}
				enc(e)
			}
			buf.WriteByte(']')
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.Sort(keys) // Go string order is bytewise UTF-8 order
			buf.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					buf.WriteByte(',')
				}
				referenceString(&buf, k)
				buf.WriteByte(':')
				enc(v[k])
			}
			buf.WriteByte('}')
		default:
			panic(fmt.Sprintf("unexpected type %T", v))
		}
	}
	enc(v)
	return buf.Bytes()
}

func referenceString(buf *bytes.Buffer, s string) {
	buf.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			buf.WriteString(`\"`)
		case r == '\\':
			buf.WriteString(`\\`)
		case r == '\b':
			buf.WriteString(`\b`)
		case r == '\f':
			buf.WriteString(`\f`)
		case r == '\n':
			buf.WriteString(`\n`)
		case r == '\r':
			buf.WriteString(`\r`)
		case r == '\t':
			buf.WriteString(`\t`)
		case r < 0x20:
			fmt.Fprintf(buf, `\u%04x`, r)
		default:
			buf.WriteRune(r)
		}
	}
	buf.WriteByte('"')
}

// mustRefuseValid reports whether a document that json.Valid accepts and that
// is valid UTF-8 still has to be refused: it has a duplicate key, nesting
// deeper than 1000, or a lone surrogate escape.
func mustRefuseValid(data []byte) bool {
	if hasLoneSurrogate(data) {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // 1e400 is valid JSON but overflows float64
	// One set of seen keys per open container; nil for arrays.
	var stack []map[string]bool
	// Per container: whether the next token is a key. Inside an object
	// tokens alternate key, value, and Token does not say which is which.
	var parity []bool
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			panic(fmt.Sprintf("Token on json.Valid input: %v", err))
		}
		top := len(stack) - 1
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				if top >= 0 && stack[top] != nil {
					parity[top] = true // a value ended; next is a key
				}
				if len(stack)+1 > maxDepth {
					return true
				}
				if tok == '{' {
					stack = append(stack, map[string]bool{})
					parity = append(parity, true)
				} else {
					stack = append(stack, nil)
					parity = append(parity, false)
				}
			default:
				stack = stack[:top]
				parity = parity[:top]
			}
		default:
			if top >= 0 && stack[top] != nil {
				if parity[top] {
					k := tok.(string)
					if stack[top][k] {
						return true
					}
					stack[top][k] = true
				}
				parity[top] = !parity[top]
			}
		}
	}
}

// hasLoneSurrogate reports whether a json.Valid document has a \u escape
// for a UTF-16 surrogate that is not part of a high-low pair.
func hasLoneSurrogate(b []byte) bool {
	hex := func(s []byte) rune {
		var r rune
		for _, c := range s {
			switch {
			case c <= '9':
				r = r<<4 | rune(c-'0')
			case c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				r = r<<4 | rune(c-'a'+10)
			}
		}
		return r
	}
	inStr := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !inStr {
			inStr = c == '"'
			continue
		}
		switch c {
		case '"':
			inStr = false
		case '\\':
			i++
			if b[i] != 'u' {
				continue
			}
			r := hex(b[i+1 : i+5])
			i += 4 // now at the last hex digit
			switch {
			case 0xdc00 <= r && r <= 0xdfff:
				return true
			case 0xd800 <= r && r <= 0xdbff:
				if i+6 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
					if lo := hex(b[i+3 : i+7]); 0xdc00 <= lo && lo <= 0xdfff {
						i += 6
						continue
					}
				}
				return true
			}
		}
	}
	return false
}

// checkCanonicalize runs Canonicalize on in and checks every invariant the
// package promises, failing t on the first violation. It is shared by the
// property tests and FuzzCanonicalize.
func checkCanonicalize(t testing.TB, in []byte, ignore []Path) {
	t.Helper()
	out, err := Canonicalize(in, ignore)
	utf8OK := utf8.Valid(in)
	jsonOK := json.Valid(in)

	if err != nil {
		if !errors.Is(err, ErrNotCanonicalizable) {
			t.Fatalf("Canonicalize(%q): error %v does not wrap ErrNotCanonicalizable", in, err)
		}
		if out != nil {
			t.Fatalf("Canonicalize(%q): non-nil output %q with error", in, out)
		}
		// Refusing is always safe, but it should only happen for the
		// documented reasons.
		if utf8OK && jsonOK && !mustRefuseValid(in) {
			t.Fatalf("Canonicalize(%q) refused a document it should accept: %v", in, err)
		}
		return
	}

	if !utf8OK {
		t.Fatalf("Canonicalize(%q) accepted invalid UTF-8", in)
	}
	if !jsonOK {
		t.Fatalf("Canonicalize(%q) accepted input encoding/json rejects, output %q", in, out)
	}
	if mustRefuseValid(in) {
		t.Fatalf("Canonicalize(%q) accepted a document with a duplicate key, lone surrogate or too deep nesting", in)
	}
	if !json.Valid(out) || !utf8.Valid(out) {
		t.Fatalf("Canonicalize(%q) = %q, which is not valid JSON", in, out)
	}
	if len(out) > len(in) {
		t.Fatalf("Canonicalize(%q) = %q, longer than the input", in, out)
	}
	for _, ign := range [][]Path{ignore, nil} {
		again, err := Canonicalize(out, ign)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("Canonicalize not idempotent (ignore %q): Canonicalize(%q) = %q, %v", ign, out, again, err)
		}
	}

	want, err := decodeUseNumber(in)
	if err != nil {
		t.Fatalf("encoding/json cannot decode accepted input %q: %v", in, err)
	}
	want = removePaths(want, ignore)
	got, err := decodeUseNumber(out)
	if err != nil {
		t.Fatalf("encoding/json cannot decode output %q: %v", out, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Canonicalize(%q) = %q, which decodes to %#v, want %#v", in, out, got, want)
	}
	if ref := referenceCanonical(want); !bytes.Equal(out, ref) {
		t.Fatalf("Canonicalize(%q) = %q, reference encoding is %q", in, out, ref)
	}
}
