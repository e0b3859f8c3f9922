// Package fingerprint computes the digest that tells two attempts of one
// operation from two different operations sent under the same key.
package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
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
	// JSON canonicalises the body first (canonicalJSON); a body that is
	// not canonicalisable is taken as raw bytes, under a different tag, so
	// the two forms never collide.
	JSON bool
	// JSONOptions narrows the canonical body to chosen members (used only
	// with JSON). A narrowed body is hashed under a tag that names the
	// pointers, so it never collides with a whole body or another subset.
	JSONOptions JSONOptions
}

// Compute returns the SHA-256 of an unambiguous encoding of the method,
// the path, the values of the headers named in include (in that order of
// names, each with its values in arrival order) and the body (tagged raw
// or canonical JSON). Every field is
// length-prefixed, so no shifting of bytes between fields yields the same
// digest. include must be sorted, lower-case and free of duplicates (see
// Normalize).
func Compute(r Request, include []string) idem.Fingerprint {
	body, tag := r.Body, "raw"
	var subset []byte
	if r.JSON {
		c := canonPool.Get().(*canon)
		defer c.release()
		if out, ok := c.run(r.Body, r.JSONOptions); ok {
			body, tag = out, "json"
			if !r.JSONOptions.empty() {
				tag, subset = "json-subset", subsetTag(r.JSONOptions)
			}
		}
	}
	// The encoding is hashed in one call from a buffer on the stack when it
	// fits (the usual write request), which costs no allocation at all.
	var buf [smallEncoding]byte
	b := appendStr(buf[:0], version)
	b = appendStr(b, r.Method)
	b = appendStr(b, r.Path)
	b = binary.AppendUvarint(b, uint64(len(include)))
	for _, name := range include {
		b = appendStr(b, name)
		n := 0
		for _, hd := range r.Headers {
			if hd.Name == name {
				n++
			}
		}
		b = binary.AppendUvarint(b, uint64(n))
		for _, hd := range r.Headers {
			if hd.Name == name {
				b = appendStr(b, hd.Value)
			}
		}
	}
	b = appendStr(b, tag)
	b = append(b, subset...)
	b = binary.AppendUvarint(b, uint64(len(body)))
	if len(b)+len(body) <= len(buf) {
		return sha256.Sum256(append(b, body...))
	}
	h := sha256.New()
	h.Write(slices.Clone(b)) // a copy, so that buf never escapes to the heap
	h.Write(body)
	var fp idem.Fingerprint
	h.Sum(fp[:0])
	return fp
}

// smallEncoding is the size of the stack buffer Compute encodes into.
const smallEncoding = 2048

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
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

// subsetTag encodes the include and exclude pointers, each list sorted and
// free of duplicates, length-prefixed like every other field.
func subsetTag(o JSONOptions) []byte {
	var b []byte
	for _, ps := range [][]jsonpointer.Pointer{o.Include, o.Exclude} {
		texts := make([]string, 0, len(ps))
		for _, p := range ps {
			texts = append(texts, p.String())
		}
		slices.Sort(texts)
		texts = slices.Compact(texts)
		b = binary.AppendUvarint(b, uint64(len(texts)))
		for _, t := range texts {
			b = appendStr(b, t)
		}
	}
	return b
}
