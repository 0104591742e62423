package canonjson

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// writes canonicalises data on a parser of its own and returns the result
// and the number of bytes written on the way: every byte appended to the
// output (the canonical text plus what ignored members cut off again) and
// every byte order and place copied.
func writes(t *testing.T, data []byte, ignore []Path) ([]byte, int) {
	t.Helper()
	p := &parser{passLimit: maxPasses}
	out, err := p.canonicalize(data, ignore)
	if err != nil {
		t.Fatalf("canonicalize(%.40q...): %v", data, err)
	}
	return out, len(out) + p.cut + p.moved
}

// TestWritesLinear checks that the bytes written to canonicalise a document
// stay proportional to its size, whatever its shape: in particular not to
// size × depth for a large value under deeply nested unsorted objects. It
// counts bytes instead of measuring time, so it cannot be flaky; the
// benchmarks in bench_test.go show what the counts mean in time.
func TestWritesLinear(t *testing.T) {
	const size = 256 << 10
	const perByte = 2*maxPasses + 2 // the bound documented on maxPasses
	// Cuts most of the document, objects left for place included.
	deepIgnore := []Path{slices.Repeat(Path{"a"}, 500)}
	for _, tc := range []struct {
		name   string
		in     []byte
		ignore []Path
	}{
		{"flat", deepObjects(1, size), nil},
		{"deep objects", deepObjects(maxDepth-1-leafDepth, size), nil},
		{"deep objects, ignore inside", deepObjects(maxDepth-1-leafDepth, size), deepIgnore},
		{"deep arrays", deepArrays(maxDepth-2-leafDepth, size), nil},
		{"deep mixed", deepMixed(maxDepth-1-leafDepth, size), nil},
		{"wide", wideObject(size / 16), nil},
		{"document", largeDocument(size), benchIgnore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, n := writes(t, tc.in, tc.ignore)
			if n > perByte*len(tc.in) {
				t.Errorf("%d bytes written for %d bytes of input, more than %d per byte", n, len(tc.in), perByte)
			}
		})
	}

	// And the count per byte must not grow with the depth: about equal
	// sizes, 100 levels against the most the depth limit leaves room for.
	_, shallow := writes(t, deepObjects(100, size), nil)
	_, deep := writes(t, deepObjects(maxDepth-1-leafDepth, size), nil)
	if float64(deep) > 1.1*float64(shallow) {
		t.Errorf("%d bytes written at depth %d, %d at depth 100, for about %d bytes of input each",
			deep, maxDepth-1-leafDepth, shallow, size)
	}
}

// TestPlaceMatchesOrder checks that leaving objects for place gives exactly
// what moving them into order right away gives, for any limit on how often
// order may move a byte: with limit 0 place rearranges every unsorted
// object, with the default it only comes in under deep nesting, which the
// generated documents seldom reach.
func TestPlaceMatchesOrder(t *testing.T) {
	type doc struct {
		in     []byte
		ignore []Path
	}
	var docs []doc
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		g := &gen{rng: rng}
		g.value(0)
		docs = append(docs, doc{g.buf.Bytes(), g.ignorePaths()})
	}
	// Deep unsorted nesting with ignored members at many depths, some of
	// them holding objects that place would have had to rearrange.
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, `{"z":{"y":%d,"x":{"w":1,"v":2}},"m":{"q":{"b":1,"a":2},"p":0},"a":`, i)
	}
	b.WriteString(`[{"b":{"d":1,"c":2},"a":{"f":1,"e":{"h":1,"g":2}}}]`)
	b.WriteString(strings.Repeat(`,"c":{"k":0,"j":{"b":1,"a":0}}}`, 40))
	deep := []byte(b.String())
	for _, ignore := range [][]Path{
		nil,
		{{"m"}},
		{{"a", "a", "m"}, {"a", "z", "x"}},
		{append(slices.Repeat(Path{"a"}, 39), "c")},
		{append(slices.Repeat(Path{"a"}, 20), "a")},
	} {
		docs = append(docs, doc{deep, ignore})
	}
	docs = append(docs,
		doc{deepObjects(50, 4<<10), nil},
		// Refused deep down, the error must not change either.
		doc{[]byte(strings.Repeat(`{"b":0,"a":`, 50) + `{"x":1,"x":2}` + strings.Repeat("}", 50)), nil},
		doc{[]byte(strings.Repeat(`{"b":{"d":0,"c":1},"a":`, 50) + `[1,]` + strings.Repeat("}", 50)), nil},
		doc{deepMixed(50, 4<<10), []Path{{"b"}, {"a", "b"}}},
		doc{wideObject(1000), nil},
		doc{largeDocument(64 << 10), benchIgnore},
	)

	for _, d := range docs {
		checkPlace(t, d.in, d.ignore)
	}
	for _, d := range docs[len(docs)-11:] {
		checkCanonicalize(t, d.in, d.ignore)
	}
}

// checkPlace checks that canonicalize gives what Canonicalize gives for
// every limit on how often order may move a byte, down to 0 (place
// rearranges every unsorted object).
func checkPlace(t *testing.T, data []byte, ignore []Path) {
	t.Helper()
	want, wantErr := Canonicalize(data, ignore)
	for limit := range maxPasses {
		p := &parser{passLimit: limit}
		got, err := p.canonicalize(data, ignore)
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || !bytes.Equal(got, want) {
			t.Fatalf("limit %d: canonicalize(%.200q, %q)\n got %.200q, %v\nwant %.200q, %v",
				limit, data, ignore, got, err, want, wantErr)
		}
	}
}
