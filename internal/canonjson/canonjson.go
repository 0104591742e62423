package canonjson

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrNotCanonicalizable is wrapped by every error Canonicalize returns because
// of the document itself. A caller that gets it should fingerprint the raw
// bytes instead: that can only produce a spurious conflict, never a false
// duplicate.
var ErrNotCanonicalizable = errors.New("canonjson: document cannot be canonicalised")

// maxDepth is the deepest nesting of arrays and objects Canonicalize accepts.
// It bounds the recursion of the parser (and therefore stack use) well below
// anything a real business payload needs.
const maxDepth = 1000

// Path names one object member from the document root, e.g.
// Path{"meta", "sent_at"} names the member "sent_at" of the object that is the
// value of the root object's member "meta". Segments are compared with the
// unescaped member names, byte for byte. A Path never descends into arrays.
//
// Path may be written as a literal to name members whose keys contain dots or
// are empty; ParsePath covers the common case.
type Path []string

// ParsePath splits a dotted path such as "meta.sent_at" into a Path. It
// reports an error if any segment is empty (including for the empty string,
// a leading or trailing dot, or ".."), because such a path is almost
// certainly a configuration mistake rather than a reference to an
// empty-named member.
func ParsePath(s string) (Path, error) {
	segs := strings.Split(s, ".")
	for i, seg := range segs {
		if seg == "" {
			return nil, fmt.Errorf("canonjson: invalid path %q: segment %d is empty", s, i+1)
		}
	}
	return Path(segs), nil
}

// Canonicalize returns the canonical form of the JSON document data, with the
// fields named by ignore removed.
//
// The canonical form is compact UTF-8 JSON with object members sorted
// bytewise by unescaped key, every string re-encoded one fixed way (only '"',
// '\\' and control characters escaped; \b \f \n \r \t short forms, otherwise
// \u00xx in lowercase hex; all other characters literal), numbers and the
// literals true, false and null copied verbatim (1, 1.0 and 1e0 stay
// different), and arrays in their original order. Each ignore path removes
// the member it names if it is reached through objects only, starting at the
// root; paths that do not exist, or that run into a non-object, are no-ops.
// See the package documentation for the full rules.
//
// Canonicalize refuses, with an error wrapping ErrNotCanonicalizable, input
// that is not valid UTF-8, is not exactly one JSON value (surrounding
// whitespace is allowed), is invalid JSON in any way, contains a \u escape
// for a lone UTF-16 surrogate, has an object with duplicate keys (after
// unescaping, ignored members included), or nests arrays and objects more
// than 1000 deep.
//
// A zero-length Path in ignore is a caller bug, not a property of the
// document; it is reported with an error that does not wrap
// ErrNotCanonicalizable.
//
// The result is freshly allocated, never longer than data, and is its own
// canonical form. Canonicalize is safe for concurrent use and does not retain
// data or ignore.
func Canonicalize(data []byte, ignore []Path) ([]byte, error) {
	for i, path := range ignore {
		if len(path) == 0 {
			return nil, fmt.Errorf("canonjson: ignore path %d is empty", i)
		}
	}
	// Validating the encoding up front keeps the string scanner simple: it
	// can copy any run of bytes >= 0x20 verbatim, knowing it is valid UTF-8.
	if !utf8.Valid(data) {
		return nil, refusef(invalidUTF8Offset(data), "invalid UTF-8")
	}

	p := parserPool.Get().(*parser)
	defer p.release()
	p.passLimit = maxPasses
	return p.canonicalize(data, ignore)
}

// canonicalize does the work of Canonicalize, once the arguments are
// checked, on a parser fresh from the pool or new.
func (p *parser) canonicalize(data []byte, ignore []Path) ([]byte, error) {
	p.data = data
	p.ignore = ignore
	// Every string in the canonical form is at most as long as in the input,
	// whitespace is dropped and everything else is copied verbatim, so one
	// buffer of len(data) bytes never needs to grow.
	p.out = make([]byte, 0, len(data))
	for i := range ignore {
		p.active = append(p.active, i)
	}

	p.skipSpace()
	if err := p.value(0, 0, len(p.active)); err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(data) {
		return nil, p.fail("unexpected data after the top-level value")
	}
	if len(p.reordered) == 0 {
		out := p.out
		p.out = nil
		return out, nil
	}
	// Reordering never changes the length: an object's members are the
	// same texts with the same number of commas between them.
	out := make([]byte, len(p.out))
	p.place(out, 0, 0, len(p.out), len(p.reordered))
	p.out = nil
	return out, nil
}

// refusef builds an error that wraps ErrNotCanonicalizable and names the
// input offset where the problem was found.
func refusef(off int, format string, args ...any) error {
	return fmt.Errorf("%w: %s at offset %d", ErrNotCanonicalizable, fmt.Sprintf(format, args...), off)
}

// invalidUTF8Offset returns the offset of the first invalid UTF-8 sequence in
// b. It only runs on the error path, so it favours simplicity over speed.
func invalidUTF8Offset(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// span is the text of one object member in parser.out, and where to find
// the objects nested in it that place has to rearrange.
type span struct {
	// start and end delimit the canonical `"key":value` text in parser.out,
	// without any separating comma. start is -1 for an ignored member.
	start, end int
	// nested is the length of parser.reordered when the value ended. The
	// objects in the value that are to be reordered are the last of those
	// recorded by then, back to the first that starts before the span.
	nested int
}

// member records one object member while its object is being parsed.
type member struct {
	// key is the unescaped key. It aliases the input when the key has no
	// escapes, and parser.keys otherwise.
	key []byte
	// span locates the member's text. (It is small so that sorting wide
	// objects moves little; that is why there is no separate ignored flag.)
	span
}

// ignored reports whether m is dropped from the output. Ignored members
// still take part in duplicate-key detection.
func (m *member) ignored() bool { return m.start < 0 }

// reordered records an object whose members were not parsed in key order
// and that order left for place to rearrange. Its text stays where it was
// written in parser.out, members in input order, until place writes the
// result.
type reordered struct {
	// start and end delimit the members' text in parser.out, between the
	// braces.
	start, end int
	// spans are the object's members in key order, ignored ones left out:
	// parser.spans[spans:spansEnd].
	spans, spansEnd int
	// inner is the index in parser.reordered of the first object nested in
	// this one that is also reordered. Objects are recorded as they end, so
	// everything from inner up to this object's own index is nested in it.
	inner int
}

// parser is a recursive-descent JSON parser that writes the canonical form as
// it goes, putting the members of an object in key order as soon as the
// object ends, except where that would move the same bytes too many times
// (see order); such objects are left for place to rearrange, in one pass
// over the finished text.
//
// Its scratch slices are stacks shared by all nesting levels (each level
// truncates back to where it started) or grow for the whole call, so a
// document needs no per-object allocations; parsers are pooled so the
// scratch space is reused across calls too.
type parser struct {
	data []byte // the input
	pos  int    // offset of the next unread byte of data
	out  []byte // the canonical output written so far

	ignore []Path
	// active is a stack of indices into ignore. Each object being parsed
	// owns a range of it: the paths that lead through every enclosing member
	// down to this object and may name one of its members.
	active []int
	// members is a stack holding the members of every object being parsed.
	members []member
	// keys holds the unescaped form of keys that contained escapes. It only
	// grows during a call, so the member keys slicing it stay valid.
	keys []byte
	// scratch is where an object's members are copied while they are
	// written back in sorted order.
	scratch []byte
	// reordered lists the objects whose members place puts in key order,
	// in the order the objects end; spans holds their members.
	reordered []reordered
	spans     []span
	// passes is set by value to the number of times order has moved the
	// text of the value just parsed (the most for any of its bytes), or
	// passLimit if anything in it is left for place.
	passes int
	// passLimit is maxPasses, except in tests that make place do more of
	// the work.
	passLimit int

	// cut and moved count the bytes written to out and then cut off again
	// (ignored members) and the bytes order and place copy, so that a test
	// can check how much writing a document takes without timing anything.
	cut, moved int
}

var parserPool = sync.Pool{New: func() any { return new(parser) }}

// maxPooledBuffer caps the scratch space kept in the pool, so that one huge
// document does not pin its memory forever.
const maxPooledBuffer = 64 << 10

// release drops every reference to caller data and returns p to the pool.
func (p *parser) release() {
	clear(p.members) // left over after an error; member keys alias the input
	p.data, p.ignore, p.out = nil, nil, nil
	p.pos, p.passes, p.cut, p.moved = 0, 0, 0, 0
	p.active = p.active[:0]
	p.members = p.members[:0]
	p.keys = p.keys[:0]
	p.scratch = p.scratch[:0]
	p.reordered = p.reordered[:0]
	p.spans = p.spans[:0]
	if cap(p.keys) > maxPooledBuffer {
		p.keys = nil
	}
	if cap(p.scratch) > maxPooledBuffer {
		p.scratch = nil
	}
	if cap(p.members) > maxPooledBuffer/32 {
		p.members = nil
	}
	if cap(p.active) > maxPooledBuffer/8 {
		p.active = nil
	}
	if cap(p.reordered) > maxPooledBuffer/32 {
		p.reordered = nil
	}
	if cap(p.spans) > maxPooledBuffer/16 {
		p.spans = nil
	}
	parserPool.Put(p)
}

// fail reports a refusal at the current position.
func (p *parser) fail(format string, args ...any) error {
	return refusef(p.pos, format, args...)
}

// describe names the byte at the current position for error messages.
func (p *parser) describe() string {
	if p.pos >= len(p.data) {
		return "end of input"
	}
	r, _ := utf8.DecodeRune(p.data[p.pos:])
	return fmt.Sprintf("%q", r)
}

// skipSpace skips the four whitespace characters JSON allows between tokens.
func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value parses the value at p.pos and sets p.passes for it. depth is the
// number of arrays and objects enclosing it; active[lo:hi] are the ignore
// paths that may name members of it, should it be an object.
func (p *parser) value(depth, lo, hi int) error {
	p.passes = 0 // scalars, and empty arrays and objects
	if p.pos >= len(p.data) {
		return p.fail("unexpected end of input, expected a value")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth, lo, hi)
	case c == '[':
		return p.array(depth)
	case c == '"':
		_, err := p.str(false)
		return err
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	default:
		return p.fail("unexpected %s, expected a value", p.describe())
	}
}

// literal copies one of the keywords true, false and null.
func (p *parser) literal(lit string) error {
	end := p.pos + len(lit)
	if end > len(p.data) || string(p.data[p.pos:end]) != lit {
		return p.fail("invalid literal, expected %s", lit)
	}
	p.out = append(p.out, lit...)
	p.pos = end
	return nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// number validates a number against the JSON grammar
//
//	-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
//
// and copies its text verbatim. It deliberately does not normalise: whether
// 1.0 means the same as 1 is up to the consumer, and treating them as
// different can only cause a spurious conflict.
func (p *parser) number() error {
	d := p.data
	i := p.pos
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && '1' <= d[i] && d[i] <= '9':
		for i++; i < len(d) && isDigit(d[i]); i++ {
		}
	default:
		return refusef(i, "invalid number, expected a digit")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			return refusef(i, "invalid number, expected a digit after the decimal point")
		}
		for i++; i < len(d) && isDigit(d[i]); i++ {
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return refusef(i, "invalid number, expected a digit in the exponent")
		}
		for i++; i < len(d) && isDigit(d[i]); i++ {
		}
	}
	// Whatever follows (say the "1" of "01") is left for the caller, which
	// rejects anything that is not a separator, a closing bracket or the end.
	p.out = append(p.out, d[p.pos:i]...)
	p.pos = i
	return nil
}

// array parses an array; its elements keep their order and are never
// subject to ignore paths.
func (p *parser) array(depth int) error {
	if depth >= maxDepth {
		return p.fail("nesting deeper than %d", maxDepth)
	}
	p.pos++ // '['
	p.out = append(p.out, '[')
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		p.out = append(p.out, ']')
		return nil
	}
	passes := 0
	for {
		if err := p.value(depth+1, 0, 0); err != nil {
			return err
		}
		passes = max(passes, p.passes)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.fail("unexpected end of input in array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			p.out = append(p.out, ',')
			p.skipSpace()
		case ']':
			p.pos++
			p.out = append(p.out, ']')
			p.passes = passes
			return nil
		default:
			return p.fail("unexpected %s in array, expected ',' or ']'", p.describe())
		}
	}
}

// object parses an object. Members are written to p.out in input order as
// they are parsed (ignored ones are written and then cut off again, since
// their values must still be validated), and only if they turn out not to be
// in key order is the object's text rearranged, by order or later by place.
// Machine-generated payloads are often already sorted, and then nothing is
// copied twice.
func (p *parser) object(depth, lo, hi int) error {
	if depth >= maxDepth {
		return p.fail("nesting deeper than %d", maxDepth)
	}
	p.pos++ // '{'
	p.out = append(p.out, '{')
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		p.out = append(p.out, '}')
		return nil
	}

	objStart := len(p.out)
	base := len(p.members)
	inner := len(p.reordered)
	passes := 0 // the most of any member that is kept
	emitted := 0
	for {
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return p.fail("unexpected %s in object, expected a string key", p.describe())
		}
		memStart := len(p.out)
		if emitted > 0 {
			p.out = append(p.out, ',')
		}
		keyStart := len(p.out)
		key, err := p.str(true)
		if err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return p.fail("unexpected %s after object key, expected ':'", p.describe())
		}
		p.pos++
		p.out = append(p.out, ':')
		p.skipSpace()

		// Work out which ignore paths concern this member: one that ends
		// here removes it; longer ones are handed down to its value.
		ignored := false
		childLo := len(p.active)
		for i := lo; i < hi; i++ {
			idx := p.active[i]
			path := p.ignore[idx]
			if path[depth] != string(key) {
				continue
			}
			if len(path) == depth+1 {
				ignored = true
			} else {
				p.active = append(p.active, idx)
			}
		}
		childHi := len(p.active)
		if ignored {
			childHi = childLo // the whole member goes; nothing inside matters
		}
		before := len(p.reordered)
		err = p.value(depth+1, childLo, childHi)
		p.active = p.active[:childLo]
		if err != nil {
			return err
		}

		m := member{key: key, span: span{start: -1}}
		if ignored {
			p.cut += len(p.out) - memStart
			p.out = p.out[:memStart] // drops the comma too
			// Forget the objects inside that were to be reordered: their
			// text is gone, and out will be overwritten where it was.
			if before < len(p.reordered) {
				p.spans = p.spans[:p.reordered[before].spans]
				p.reordered = p.reordered[:before]
			}
		} else {
			m.span = span{keyStart, len(p.out), len(p.reordered)}
			passes = max(passes, p.passes)
			emitted++
		}
		p.members = append(p.members, m)

		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.fail("unexpected end of input in object")
		}
		if c := p.data[p.pos]; c == '}' {
			p.pos++
			break
		} else if c != ',' {
			return p.fail("unexpected %s in object, expected ',' or '}'", p.describe())
		}
		p.pos++
		p.skipSpace()
	}

	if err := p.order(base, objStart, inner, passes); err != nil {
		return err
	}
	// Zero the popped entries so that the unused capacity never holds keys
	// aliasing caller data; release then only has to clear what is left.
	clear(p.members[base:])
	p.members = p.members[:base]
	p.out = append(p.out, '}')
	return nil
}

func compareMembers(a, b member) int { return bytes.Compare(a.key, b.key) }

// maxPasses is how many times order moves any byte of the output at most.
// Text that would be moved again goes to place instead, which writes every
// byte once more, straight to where it belongs. Writing out the whole
// document therefore takes at most 2*maxPasses+2 bytes written per input
// byte, however deep the objects nest.
//
// Moving an object's text into order right away is the cheaper way for the
// small, shallow objects that make up real payloads (leaving one for place
// costs a record per member and a second buffer for the result), but it
// moves the text of nested objects again at every level: a large value under
// 999 unsorted objects would be copied about 2000 times. The limit keeps the
// first and bounds the second.
const maxPasses = 4

// order refuses duplicate keys among the members of the object being
// finished, p.members[base:], and makes sure the members that are kept end
// up in key order: either it moves their text in p.out[objStart:] into
// order, or it records the object for place. It sets p.passes for the
// object; passes is the most of its members', inner the length p.reordered
// had when the object started.
func (p *parser) order(base, objStart, inner, passes int) error {
	p.passes = passes
	ms := p.members[base:]
	sorted := true
	for i := 1; i < len(ms); i++ {
		c := compareMembers(ms[i-1], ms[i])
		if c == 0 {
			return p.duplicate(ms[i].key)
		}
		if c > 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return nil
	}

	slices.SortFunc(ms, compareMembers)
	inOrder := true // as written, once the ignored members are left out
	last := -1
	for i, m := range ms {
		if i > 0 && bytes.Equal(ms[i-1].key, m.key) {
			return p.duplicate(m.key)
		}
		if !m.ignored() {
			inOrder = inOrder && m.start > last
			last = m.start
		}
	}
	if inOrder {
		return nil
	}

	if passes < p.passLimit {
		// Move the members' text aside and write it back in key order.
		// Nothing inside is left for place (that would have set passes to
		// passLimit), so no recorded offsets move with it.
		p.passes = passes + 1
		p.scratch = append(p.scratch[:0], p.out[objStart:]...)
		p.out = p.out[:objStart]
		first := true
		for _, m := range ms {
			if m.ignored() {
				continue
			}
			if !first {
				p.out = append(p.out, ',')
			}
			first = false
			p.out = append(p.out, p.scratch[m.start-objStart:m.end-objStart]...)
		}
		p.moved += 2 * len(p.scratch)
		return nil
	}

	// Leave the object as it is. Every unsorted object around it is left
	// for place too, because moving its text would invalidate the offsets
	// recorded here.
	p.passes = p.passLimit
	r := reordered{start: objStart, end: len(p.out), spans: len(p.spans), inner: inner}
	for _, m := range ms {
		if !m.ignored() {
			p.spans = append(p.spans, m.span)
		}
	}
	r.spansEnd = len(p.spans)
	p.reordered = append(p.reordered, r)
	return nil
}

// place writes the final form of p.out[start:end] to dst[at:], end-start
// bytes, with the members of the reordered objects in that text put in key
// order. Those objects are the last of p.reordered[:nested] that start at or
// after start. Every byte is copied once, straight to where it belongs.
func (p *parser) place(dst []byte, at, start, end, nested int) {
	// Objects are recorded as they end, so the last of them is the
	// outermost one that ends last, and the one before everything nested
	// in it is the outermost one before it: walking back visits the text
	// between the outermost objects from the end. Any object recorded
	// before the text began ends, and so starts, before it.
	for j := nested - 1; j >= 0 && p.reordered[j].start >= start; {
		r := &p.reordered[j]
		p.moved += copy(dst[at+r.end-start:], p.out[r.end:end])
		p.placeMembers(dst, at+r.start-start, r)
		end = r.start
		j = r.inner - 1
	}
	p.moved += copy(dst[at:], p.out[start:end])
}

// placeMembers writes the members of r to dst[at:] in key order.
func (p *parser) placeMembers(dst []byte, at int, r *reordered) {
	for i, s := range p.spans[r.spans:r.spansEnd] {
		if i > 0 {
			dst[at] = ','
			at++
			p.moved++
		}
		p.place(dst, at, s.start, s.end, s.nested)
		at += s.end - s.start
	}
}

// duplicate reports a duplicate key. Decoders disagree on which of the
// duplicates wins, so the document has no single meaning to fingerprint.
func (p *parser) duplicate(key []byte) error {
	const maxShown = 64
	shown := string(key)
	if len(shown) > maxShown {
		shown = strings.ToValidUTF8(shown[:maxShown], "") + "..."
	}
	return refusef(p.pos, "duplicate object key %q", shown)
}

// str parses the string at p.pos and writes its canonical encoding to p.out.
// If key is set it also returns the unescaped content, which aliases the
// input when the string has no escapes (the common case, which is then a
// single scan and copy).
func (p *parser) str(key bool) ([]byte, error) {
	d := p.data
	start := p.pos + 1 // after the opening quote
	i := start
	for i < len(d) && plain[d[i]] {
		i++
	}
	switch {
	case i >= len(d):
		return nil, p.fail("unterminated string")
	case d[i] == '"':
		// No escapes and no control characters: the literal text is
		// already canonical.
		p.out = append(p.out, d[p.pos:i+1]...)
		p.pos = i + 1
		return d[start:i], nil
	case d[i] == '\\':
		return p.escapedStr(start, i, key)
	default:
		return nil, refusef(i, "control character U+%04X in string", d[i])
	}
}

// plain reports the bytes that stand for themselves inside a JSON string in
// both the input and the canonical form: everything except '"', '\\' and
// control characters. (Bytes >= 0x80 are parts of UTF-8 sequences, which
// were validated up front.) A table lookup keeps the hot scanning loops to
// one load and one branch per byte.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// escapedStr finishes parsing a string that begins at start and has its
// first escape at i. It decodes the escapes and writes the canonical
// encoding; if key is set it also collects the unescaped bytes in p.keys.
func (p *parser) escapedStr(start, i int, key bool) ([]byte, error) {
	d := p.data
	keyStart := len(p.keys)
	p.out = append(p.out, d[start-1:i]...) // opening quote and plain prefix
	if key {
		p.keys = append(p.keys, d[start:i]...)
	}
	for i < len(d) {
		c := d[i]
		switch {
		case c == '"':
			p.out = append(p.out, '"')
			p.pos = i + 1
			if !key {
				return nil, nil
			}
			return p.keys[keyStart:len(p.keys):len(p.keys)], nil
		case c < 0x20:
			return nil, refusef(i, "control character U+%04X in string", c)
		case c != '\\':
			// A run of plain bytes: valid UTF-8 (checked up front) that
			// needs no escaping, so it is copied as-is.
			j := i + 1
			for j < len(d) && plain[d[j]] {
				j++
			}
			p.out = append(p.out, d[i:j]...)
			if key {
				p.keys = append(p.keys, d[i:j]...)
			}
			i = j
			continue
		}

		// An escape sequence.
		if i+1 >= len(d) {
			break
		}
		var r rune
		switch d[i+1] {
		case '"', '\\', '/':
			r = rune(d[i+1])
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			var ok bool
			if r, ok = hex4(d, i+2); !ok {
				return nil, refusef(i, "invalid \\u escape")
			}
			if utf16.IsSurrogate(r) {
				// Only a high surrogate immediately followed by an
				// escaped low surrogate is a character. Anything else
				// would decode to U+FFFD in encoding/json, merging
				// different inputs, so it is refused.
				lo, ok := rune(0), false
				if r < 0xdc00 && i+12 <= len(d) && d[i+6] == '\\' && d[i+7] == 'u' {
					lo, ok = hex4(d, i+8)
				}
				if !ok || lo < 0xdc00 || lo > 0xdfff {
					return nil, refusef(i, "lone UTF-16 surrogate in \\u escape")
				}
				r = utf16.DecodeRune(r, lo)
				i += 6
			}
			i += 4
		default:
			return nil, refusef(i, "invalid escape sequence")
		}
		i += 2
		p.out = appendRune(p.out, r)
		if key {
			p.keys = utf8.AppendRune(p.keys, r)
		}
	}
	return nil, p.fail("unterminated string")
}

// hex4 decodes the four hex digits at d[i:i+4].
func hex4(d []byte, i int) (rune, bool) {
	if i+4 > len(d) {
		return 0, false
	}
	var r rune
	for _, c := range d[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// appendRune appends the canonical encoding of r, which is a valid Unicode
// scalar value, inside a JSON string.
func appendRune(out []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	switch r {
	case '"':
		return append(out, '\\', '"')
	case '\\':
		return append(out, '\\', '\\')
	case '\b':
		return append(out, '\\', 'b')
	case '\f':
		return append(out, '\\', 'f')
	case '\n':
		return append(out, '\\', 'n')
	case '\r':
		return append(out, '\\', 'r')
	case '\t':
		return append(out, '\\', 't')
	}
	if r < 0x20 {
		return append(out, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
	}
	return utf8.AppendRune(out, r)
}
