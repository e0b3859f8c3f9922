// Package fingerprint computes the digest that tells two attempts of one
// operation from two different operations sent under the same key.
package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"slices"
	"strings"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// version separates this encoding from any later one, so a change of
// encoding can never make two different requests match.
const version = "idem-fingerprint-v1"

// Request is the part of a request that names the operation.
type Request struct {
	Method string
	// Path is the request target with its query, as sent (":path").
	Path string
	// Headers holds the request's headers; names must be lower case.
	Headers []idem.Header
	Body    []byte
	// JSON canonicalises the body first (CanonicalJSON); a body that is
	// not canonicalisable is taken as raw bytes, under a different tag, so
	// the two forms never collide.
	JSON bool
}

// Compute returns the SHA-256 of an unambiguous encoding of the method,
// the path, the values of the headers named in include (in that order of
// names, each with its values in arrival order) and the body (tagged raw
// or canonical JSON). Every field is
// length-prefixed, so no shifting of bytes between fields yields the same
// digest. include must be sorted, lower-case and free of duplicates (see
// Normalize).
func Compute(r Request, include []string) idem.Fingerprint {
	h := sha256.New()
	w := writer{h: h}
	w.str(version)
	w.str(r.Method)
	w.str(r.Path)
	w.uint(uint64(len(include)))
	for _, name := range include {
		w.str(name)
		n := 0
		for _, hd := range r.Headers {
			if hd.Name == name {
				n++
			}
		}
		w.uint(uint64(n))
		for _, hd := range r.Headers {
			if hd.Name == name {
				w.str(hd.Value)
			}
		}
	}
	body, tag := r.Body, "raw"
	if r.JSON {
		if c, ok := CanonicalJSON(r.Body); ok {
			body, tag = c, "json"
		}
	}
	w.str(tag)
	w.uint(uint64(len(body)))
	h.Write(body)
	var fp idem.Fingerprint
	h.Sum(fp[:0])
	return fp
}

// Normalize lower-cases, sorts and de-duplicates header names for Compute.
func Normalize(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, strings.ToLower(strings.TrimSpace(n)))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

type writer struct {
	h   hash.Hash
	buf [binary.MaxVarintLen64]byte
}

func (w *writer) uint(v uint64) { w.h.Write(w.buf[:binary.PutUvarint(w.buf[:], v)]) }

func (w *writer) str(s string) {
	w.uint(uint64(len(s)))
	w.h.Write([]byte(s))
}
