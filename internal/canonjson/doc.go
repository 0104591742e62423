// Package canonjson turns a JSON document into a canonical byte form so that
// two documents carrying the same data hash to the same value.
//
// It exists to fingerprint message payloads for the idempotency inbox: the
// SHA-256 of the canonical form decides whether a redelivered message with a
// known idempotency key carries the same business payload (a duplicate, safe
// to drop) or a different one (a conflict). The two possible mistakes are not
// equally bad. A false "different" only surfaces a spurious conflict; a false
// "equal" silently drops a different business intent. The package is
// therefore deliberately conservative: it never normalises anything whose
// meaning could differ between producers (numbers, for instance), and it
// refuses any input it is not certain about. Every refusal wraps
// [ErrNotCanonicalizable], and callers are expected to fall back to hashing
// the raw bytes in that case.
//
// # Canonical form
//
// The canonical form of a document is:
//
//   - Valid, compact JSON encoded as UTF-8: no whitespace outside strings.
//   - Object members sorted by key, comparing the UTF-8 bytes of the
//     unescaped keys (so "\u0041" sorts as "A").
//   - Every string (keys and values) re-encoded one fixed way: only '"',
//     '\\' and control characters below U+0020 are escaped, using \b \f \n
//     \r \t where they exist and \u00xx (lowercase hex) otherwise.
//     Everything else, including '<', '>', '&', '/', U+2028, U+2029 and all
//     non-ASCII text, is written literally. "\u00e9", "\u00E9" and "é"
//     therefore canonicalise identically.
//   - Numbers written exactly as their literal appears in the input. 1, 1.0,
//     1e0 and 10e-1 stay distinct: normalising them could merge values that a
//     consumer treats differently, while keeping them apart at worst reports
//     a spurious conflict.
//   - true, false and null written as-is; arrays keep their element order.
//   - Members named by an ignore [Path] removed. A path is followed only
//     through objects starting at the root; it never reaches into arrays,
//     and a path that does not exist in the document is not an error.
//
// The canonical form is never longer than the input, and canonicalising it
// again returns it unchanged.
//
// Canonicalize refuses (with an error wrapping [ErrNotCanonicalizable]):
//
//   - input that is not valid UTF-8;
//   - input that is not exactly one JSON value, apart from surrounding
//     whitespace (space, tab, CR, LF);
//   - any syntax error: bad literals, numbers, escapes, raw control
//     characters in strings, missing or extra separators, and so on;
//   - \u escapes that encode a lone UTF-16 surrogate (encoding/json would
//     silently turn them into U+FFFD, merging distinct inputs);
//   - objects with duplicate keys, compared after unescaping, including keys
//     that would be ignored (JSON decoders disagree on which duplicate wins,
//     so there is no single meaning to fingerprint);
//   - nesting of arrays and objects deeper than 1000 levels.
//
// Ignored members are still parsed and validated; ignoring a member never
// makes an invalid document acceptable.
package canonjson
