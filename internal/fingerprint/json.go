package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/jsonscan"
)

// errNotCanonical reports a body the canonicaliser declines to rewrite.
var errNotCanonical = errors.New("not canonicalisable JSON")

// JSONOptions narrows the JSON body that takes part in a fingerprint, by
// RFC 6901 pointer, so that a JSON-RPC retry under a new "id",
// or with a new progress token in "params._meta", is the same operation
// while a changed argument is not.
//
// Exclude removes the object members and array elements it addresses
// (an array element removed leaves the others in order; the pointer ""
// removes the whole body). Include, when not empty, keeps only the values
// it addresses: the canonical form is then an object mapping each
// included pointer that addresses a value to that value (a pointer that
// addresses nothing is left out, so an absent member differs from a
// null one), with the excluded members removed inside the values. A
// pointer that addresses nothing in a body changes nothing.
type JSONOptions struct {
	Include, Exclude []jsonpointer.Pointer
}

func (o JSONOptions) empty() bool { return len(o.Include) == 0 && len(o.Exclude) == 0 }

var canonPool = sync.Pool{New: func() any { return new(canon) }}

// canon is the canonicaliser's reusable state.
type canon struct {
	jsonscan.Scanner
	out     []byte
	scratch []byte
	members []member // a stack: each open object's members sit on top

	include, exclude [][]string
	captured         [][]byte // by include index
}

// member is one object member: its decoded name, and where its
// `"name":value` text sits in out when it was written.
type member struct {
	key        []byte
	start, end int
	written    bool
}

// maxPooledBuffer keeps one huge body from pinning its buffers in the pool.
const maxPooledBuffer = 4 << 20

func (c *canon) release() {
	if cap(c.out) > maxPooledBuffer || cap(c.scratch) > maxPooledBuffer {
		return
	}
	c.Scanner, c.include, c.exclude, c.captured = jsonscan.Scanner{}, nil, nil, nil
	c.members = c.members[:0]
	canonPool.Put(c)
}

// run canonicalises body under opts. The result aliases c's buffer.
func (c *canon) run(body []byte, opts JSONOptions) ([]byte, bool) {
	c.Scanner, c.out = jsonscan.Scanner{Data: body}, c.out[:0]
	c.members = c.members[:0]
	c.include, c.exclude = tokensOf(opts.Include), tokensOf(opts.Exclude)
	c.captured = make([][]byte, len(c.include))
	var inc, exc []int
	for i := range c.include {
		inc = append(inc, i)
	}
	for i := range c.exclude {
		exc = append(exc, i)
	}
	emit := len(c.include) == 0
	if emit && endsHere(c.exclude, exc, 0) {
		emit = false // Exclude "" removes the whole body
	}
	c.SkipSpace()
	if err := c.value(0, emit, inc, exc); err != nil {
		return nil, false
	}
	c.SkipSpace()
	if c.Pos != len(c.Data) {
		return nil, false // trailing data after the value
	}
	if len(c.include) > 0 {
		c.writeIncluded(opts.Include)
	}
	return c.out, true
}

func tokensOf(ps []jsonpointer.Pointer) [][]string {
	if len(ps) == 0 {
		return nil
	}
	out := make([][]string, len(ps))
	for i, p := range ps {
		out[i] = p.Tokens()
	}
	return out
}

// writeIncluded replaces out by the object of included values, sorted by
// pointer text as any canonical object is.
func (c *canon) writeIncluded(ps []jsonpointer.Pointer) {
	idx := make([]int, 0, len(ps))
	for i := range ps {
		if c.captured[i] != nil {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return strings.Compare(ps[a].String(), ps[b].String()) })
	idx = slices.CompactFunc(idx, func(a, b int) bool { return ps[a].String() == ps[b].String() })
	c.out = append(c.out[:0], '{')
	for n, i := range idx {
		if n > 0 {
			c.out = append(c.out, ',')
		}
		c.out = appendMarshalled(c.out, ps[i].String())
		c.out = append(c.out, ':')
		c.out = append(c.out, c.captured[i]...)
	}
	c.out = append(c.out, '}')
}

// endsHere reports whether one of the live pointers ends at depth.
func endsHere(ptrs [][]string, live []int, depth int) bool {
	for _, i := range live {
		if len(ptrs[i]) == depth {
			return true
		}
	}
	return false
}

// child returns the live pointers that go on through the member or
// element whose reference token at depth matches.
func child(ptrs [][]string, live []int, depth int, matches func(tok string) bool) []int {
	var out []int
	for _, i := range live {
		if len(ptrs[i]) > depth && matches(ptrs[i][depth]) {
			out = append(out, i)
		}
	}
	return out
}

// value reads the value at c.Pos (after white space), at depth (the top
// level is 0), writing its canonical form to out when emit is set. inc and
// exc are the include and exclude pointers whose first depth tokens lead
// here.
func (c *canon) value(depth int, emit bool, inc, exc []int) error {
	if depth > jsonscan.MaxDepth {
		return errNotCanonical
	}
	// An included value is written even where its parent is not; Exclude
	// wins over Include for the same value.
	capture := endsHere(c.include, inc, depth) && !endsHere(c.exclude, exc, depth)
	start, wasEmitting := len(c.out), emit
	if capture {
		emit = true
	}
	if err := c.bareValue(depth, emit, inc, exc); err != nil {
		return err
	}
	if capture {
		v := bytes.Clone(c.out[start:])
		for _, i := range inc {
			if len(c.include[i]) == depth {
				c.captured[i] = v
			}
		}
		if !wasEmitting {
			c.out = c.out[:start]
		}
	}
	return nil
}

func (c *canon) bareValue(depth int, emit bool, inc, exc []int) error {
	if c.Pos >= len(c.Data) {
		return errNotCanonical
	}
	switch ch := c.Data[c.Pos]; {
	case ch == '{':
		return c.object(depth, emit, inc, exc)
	case ch == '[':
		return c.array(depth, emit, inc, exc)
	case ch == '"':
		raw, _, simple, ok := c.String()
		if !ok {
			return errNotCanonical
		}
		if emit {
			if simple {
				c.out = append(c.out, raw...)
			} else {
				s, ok := jsonscan.Decode(raw)
				if !ok {
					return errNotCanonical
				}
				c.out = appendMarshalled(c.out, string(s))
			}
		} else if !simple {
			if _, ok := jsonscan.Decode(raw); !ok {
				return errNotCanonical
			}
		}
		return nil
	case ch == '-' || ('0' <= ch && ch <= '9'):
		start := c.Pos
		if !c.Number() {
			return errNotCanonical
		}
		if emit {
			c.out = append(c.out, c.Data[start:c.Pos]...)
		}
		return nil
	default:
		lit := c.Literal()
		if lit == "" {
			return errNotCanonical
		}
		if emit {
			c.out = append(c.out, lit...)
		}
		return nil
	}
}

// open steps over the opening byte of an object or array, and over its
// closing byte too when it is empty, which it reports; each is written to
// the output when emit.
func (c *canon) open(emit bool, opening, closing byte) (empty bool) {
	c.Pos++
	if emit {
		c.out = append(c.out, opening)
	}
	c.SkipSpace()
	if c.Pos < len(c.Data) && c.Data[c.Pos] == closing {
		c.Pos++
		if emit {
			c.out = append(c.out, closing)
		}
		return true
	}
	return false
}

func (c *canon) object(depth int, emit bool, inc, exc []int) error {
	objStart := len(c.out)
	if c.open(emit, '{', '}') {
		return nil
	}
	base := len(c.members)
	defer func() { c.members = c.members[:base] }()
	sorted, written := true, 0
	for {
		raw, key, simple, err := c.memberName()
		if err != nil {
			return err
		}
		var childInc, childExc []int
		if len(inc) > 0 || len(exc) > 0 {
			matches := func(tok string) bool { return tok == string(key) }
			childInc = child(c.include, inc, depth, matches)
			childExc = child(c.exclude, exc, depth, matches)
		}
		m := member{key: key}
		m.written = emit && !endsHere(c.exclude, childExc, depth+1)
		if m.written {
			if written > 0 {
				c.out = append(c.out, ',')
			}
			written++
			m.start = len(c.out)
			if simple {
				c.out = append(c.out, raw...)
			} else {
				c.out = appendMarshalled(c.out, string(key))
			}
			c.out = append(c.out, ':')
		}
		c.SkipSpace()
		if err := c.value(depth+1, m.written, childInc, childExc); err != nil {
			return err
		}
		m.end = len(c.out)
		if n := len(c.members); n > base && bytes.Compare(c.members[n-1].key, key) >= 0 {
			sorted = false
		}
		c.members = append(c.members, m)
		more, ok := c.Separator('}')
		if !ok {
			return errNotCanonical
		}
		if !more {
			break
		}
	}
	if !sorted {
		if err := c.sortMembers(base, objStart, emit); err != nil {
			return err
		}
	}
	if emit {
		c.out = append(c.out, '}')
	}
	return nil
}

// memberName reads a member's name and its colon: the name's raw text,
// its decoded value, and whether the raw text is already canonical.
func (c *canon) memberName() (raw, key []byte, simple bool, err error) {
	c.SkipSpace()
	if c.Pos >= len(c.Data) || c.Data[c.Pos] != '"' {
		return nil, nil, false, errNotCanonical
	}
	raw, _, simple, ok := c.String()
	if !ok {
		return nil, nil, false, errNotCanonical
	}
	key = raw[1 : len(raw)-1]
	if !simple {
		if key, ok = jsonscan.Decode(raw); !ok {
			return nil, nil, false, errNotCanonical
		}
	}
	if !c.Consume(':') {
		return nil, nil, false, errNotCanonical
	}
	return raw, key, simple, nil
}

// sortMembers puts the members of the object whose members start at
// c.members[base] in key order, refusing a duplicate name, and when emit
// rewrites the object's text (from objStart, its '{') in that order.
func (c *canon) sortMembers(base, objStart int, emit bool) error {
	ms := c.members[base:]
	slices.SortFunc(ms, func(a, b member) int { return bytes.Compare(a.key, b.key) })
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(ms[i].key, ms[i-1].key) {
			return errNotCanonical
		}
	}
	if emit {
		from := objStart + 1
		c.scratch = append(c.scratch[:0], c.out[from:]...)
		c.out = c.out[:from]
		n := 0
		for _, m := range ms {
			if !m.written {
				continue
			}
			if n > 0 {
				c.out = append(c.out, ',')
			}
			n++
			c.out = append(c.out, c.scratch[m.start-from:m.end-from]...)
		}
	}
	return nil
}

func (c *canon) array(depth int, emit bool, inc, exc []int) error {
	if c.open(emit, '[', ']') {
		return nil
	}
	written := 0
	for i := 0; ; i++ {
		var childInc, childExc []int
		if len(inc) > 0 || len(exc) > 0 {
			matches := func(tok string) bool { return jsonpointer.MatchesIndex(tok, i) }
			childInc = child(c.include, inc, depth, matches)
			childExc = child(c.exclude, exc, depth, matches)
		}
		write := emit && !endsHere(c.exclude, childExc, depth+1)
		if write {
			if written > 0 {
				c.out = append(c.out, ',')
			}
			written++
		}
		c.SkipSpace()
		if err := c.value(depth+1, write, childInc, childExc); err != nil {
			return err
		}
		more, ok := c.Separator(']')
		if !ok {
			return errNotCanonical
		}
		if !more {
			break
		}
	}
	if emit {
		c.out = append(c.out, ']')
	}
	return nil
}

// appendMarshalled appends s as encoding/json encodes it, which is
// deterministic for a given value.
func appendMarshalled(out []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(out, b...)
}
