package canonjson

import (
	"testing"
	"unicode/utf8"
)

// fuzzIgnore is a fixed set of ignore paths that the fuzzer can reach by
// producing these keys.
var fuzzIgnore = []Path{{"a"}, {"b", "c"}, {"meta", "sent_at"}, {""}}

// FuzzCanonicalize checks, for arbitrary input bytes, with and without
// ignore paths, that Canonicalize:
//
//   - never panics;
//   - refuses, with an error wrapping ErrNotCanonicalizable and a nil
//     result, any input encoding/json rejects (json.Valid is false) and any
//     input that is not valid UTF-8;
//   - refuses a valid UTF-8 document that json.Valid accepts only if it has
//     a duplicate key, a lone surrogate escape or nesting deeper than 1000;
//   - when it returns no error, returns output that is json.Valid, no longer
//     than the input, idempotent (Canonicalize(output) == output), and
//     semantically equal to the input minus the ignored members: both decode
//     with encoding/json (UseNumber) to reflect.DeepEqual values; moreover
//     the output is byte-for-byte what an independent encoder following the
//     documented canonical rules produces from that decoded value;
//   - returns the same result and error however the work of sorting object
//     members is split between order (moving text as each object ends) and
//     place (rearranging it once at the end); see maxPasses.
//
// The seed corpus lives in testdata/fuzz/FuzzCanonicalize.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,null]}`,
		`{"meta":{"sent_at":"x","id":1},"a":2,"b":{"c":3,"d":4}}`,
		`"\u0041\ud83d\ude00\n\/"`,
		`[1,1.0,1e0,-0.5E+10]`,
		`{"a":1,"\u0061":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkCanonicalize(t, data, nil)
		checkCanonicalize(t, data, fuzzIgnore)
		if utf8.Valid(data) { // canonicalize expects Canonicalize's checks done
			checkPlace(t, data, nil)
			checkPlace(t, data, fuzzIgnore)
		}
	})
}
