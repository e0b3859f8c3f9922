package fingerprint

// reference_test.go keeps the tree-free but token-by-token canonicaliser that
// canonicalJSON replaced (it cost 100–190 ms on 1 MiB), unchanged
// but for its names, as the reference the differential fuzz test
// FuzzCanonicalMatchesReference and the benchmarks compare against.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
)

// errRefNotCanonical reports a body canonicalJSON declines to rewrite.
var errRefNotCanonical = errors.New("not canonicalisable JSON")

// refMaxJSONDepth bounds nesting, so a hostile body cannot exhaust the stack.
const refMaxJSONDepth = 200

// canonicalJSON rewrites a JSON document so that two serialisations of the
// same value compare equal: object members sorted by key, no insignificant
// whitespace, strings re-encoded from their decoded value. Numbers keep
// their literal text (1 and 1.0 stay different: a number is what the client
// sent), and a string never equals a number. It reports false, and the
// caller should fingerprint the raw bytes, for anything that is not exactly
// one JSON value, for duplicate member names (whose meaning differs between
// parsers) and for nesting deeper than 200.
func referenceCanonicalJSON(body []byte) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(body))
	if err := refValue(dec, &out, 0); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data after the value
	}
	return out.Bytes(), true
}

func refValue(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	if depth > refMaxJSONDepth {
		return errRefNotCanonical
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			return refObject(dec, out, depth)
		case '[':
			return refArray(dec, out, depth)
		}
		return errRefNotCanonical
	case string:
		refWriteString(out, v)
	case json.Number:
		out.WriteString(v.String())
	case bool:
		if v {
			out.WriteString("true")
		} else {
			out.WriteString("false")
		}
	case nil:
		out.WriteString("null")
	default:
		return errRefNotCanonical
	}
	return nil
}

type refMember struct {
	key   string
	value []byte
}

func refObject(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	var members []refMember
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, ok := tok.(string)
		if !ok {
			return errRefNotCanonical
		}
		var v bytes.Buffer
		if err := refValue(dec, &v, depth+1); err != nil {
			return err
		}
		members = append(members, refMember{key, v.Bytes()})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return err
	}
	slices.SortFunc(members, func(a, b refMember) int { return strings.Compare(a.key, b.key) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			if m.key == members[i-1].key {
				return errRefNotCanonical
			}
			out.WriteByte(',')
		}
		refWriteString(out, m.key)
		out.WriteByte(':')
		out.Write(m.value)
	}
	out.WriteByte('}')
	return nil
}

func refArray(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	out.WriteByte('[')
	for i := 0; dec.More(); i++ {
		if i > 0 {
			out.WriteByte(',')
		}
		if err := refValue(dec, out, depth+1); err != nil {
			return err
		}
	}
	out.WriteByte(']')
	_, err := dec.Token() // the closing ']'
	return err
}

func refWriteString(out *bytes.Buffer, s string) {
	// encoding/json's string encoding is deterministic for a given value.
	b, _ := json.Marshal(s)
	out.Write(b)
}
