package fingerprint

import "bytes"

// canonicalJSON is the canonical form of a whole body with no options, for
// the tests (the server reaches the canonicaliser through Compute).

// canonicalJSON rewrites a JSON document so that two serialisations of the
// same value compare equal: object members sorted by key, no insignificant
// whitespace, strings re-encoded from their decoded value as encoding/json
// encodes them. Numbers keep their literal text (1 and 1.0 stay different:
// a number is what the client sent), and a string never equals a number.
// It reports false, and the caller should fingerprint the raw bytes, for
// anything that is not exactly one JSON value (RFC 8259), for duplicate
// member names (whose meaning differs between parsers) and for nesting
// deeper than 200.
//
// It walks the body once, writing the canonical form into one buffer: no
// tree and no per-token allocation. Only objects whose members arrive out
// of order are rewritten in place, and only strings with escapes, HTML
// characters or invalid UTF-8 go through encoding/json. Its output is
// byte-for-byte that of the token-by-token canonicaliser it replaced
// (reference_test.go, FuzzCanonicalMatchesReference).
func canonicalJSON(body []byte) ([]byte, bool) {
	c := canonPool.Get().(*canon)
	defer c.release()
	out, ok := c.run(body, JSONOptions{})
	if !ok {
		return nil, false
	}
	return bytes.Clone(out), true
}
