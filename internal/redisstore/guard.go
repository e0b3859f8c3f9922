package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// go-redis trusts the lengths a reply declares: its reader allocates what a
// header announces before a byte of the body has arrived (go-redis v9.23
// internal/proto/reader.go: readStringReply makes n+2 bytes for '$', '='
// and '!'; readSlice makes n elements for '*', '~' and '>'; readMap makes a
// map of n entries for '%'; Discard skips the 2n entries of an attribute
// '|' by recursion), it follows nesting by recursion (ReadReply, readSlice,
// Discard), and readLine grows a line without bound until it meets '\n'
// ('+', '-', ':', ',', '#', '(' and '_' replies; ReadBytes). A store, or
// anything on a plain path to it, could so end the process with one reply:
// a length of 2^62 panics in makeslice, 2^31 elements exhaust memory, a
// nesting a million deep exhausts the goroutine stack (a fatal error, not
// a panic). The guard below reads the RESP framing of every byte the
// client receives, beneath go-redis's buffered reader, and fails the read
// before go-redis sees a header past the bounds: the call gets an error,
// go-redis drops the connection (error.go isBadConn: any error that is not
// a Redis reply), and nothing was allocated for it.

// DefaultMaxReply bounds the bytes the replies being read at once on all
// the connections of one client may declare together: the largest record
// this server stores is one response body held whole in memory under
// --max-buffered-bytes, whose default when no memory limit is known is
// 256 MiB, plus its head. One reply may take all of it, and nothing
// larger is ever written by the server.
const DefaultMaxReply = 256<<20 + 1<<20

const (
	// maxReplyDepth bounds the nesting of aggregates in one reply. The
	// deepest reply the client reads is CLUSTER SLOTS (slot ranges, each
	// an array of nodes, each an array of address, port, id and
	// metadata): four levels.
	maxReplyDepth = 16
	// maxReplyLine bounds a simple string, error, number or double line.
	// Redis's own longest are error texts of a few hundred bytes.
	maxReplyLine = 64 << 10
	// elemCost and entryCost are what go-redis allocates for each element
	// an aggregate header declares before reading it: one interface value
	// (readSlice's make([]interface{}, n)), and for a map's entry a key
	// and a value with the map's own overhead (readMap's make(map, n)),
	// counted generously.
	elemCost  = 16
	entryCost = 64
	// maxBudget keeps the scanner's arithmetic clear of overflow: a
	// length past it is refused whatever the budget says.
	maxBudget = 1 << 40
)

// replyBudget is shared by every connection of one client: what the replies
// being read now have declared, in bytes go-redis allocates for them.
type replyBudget struct {
	max      int64
	inFlight atomic.Int64
}

func newReplyBudget(max int64) *replyBudget {
	if max <= 0 || max > maxBudget {
		max = DefaultMaxReply
	}
	return &replyBudget{max: max}
}

// ReplyRefusedError is a store call's error when the store's reply broke
// a bound of the guard: the connection was dropped, and the call failed
// as for any broken connection.
type ReplyRefusedError struct{ Reason string }

func (e *ReplyRefusedError) Error() string { return "redisstore: reply refused: " + e.Reason }

// StoreFailure names the error in the store failure metric.
func (e *ReplyRefusedError) StoreFailure() string { return "reply_refused" }

func refuse(format string, args ...any) error {
	return &ReplyRefusedError{Reason: fmt.Sprintf(format, args...)}
}

// guardedDialer dials as go-redis's own dialer would (options.go
// NewDialer: a net.Dialer with the dial timeout and TCP keep-alive, then
// TLS when configured), and wraps the connection in the guard, above TLS
// so that it reads what go-redis reads. Every topology dials through
// Options.Dialer: a Sentinel client for the sentinels and for the primary
// (sentinel.go sentinelOptions, masterReplicaDialer), a Cluster client for
// every node (osscluster.go clientOptions).
func guardedDialer(timeout time.Duration, tlsConf *tls.Config, budget *replyBudget) func(context.Context, string, string) (net.Conn, error) {
	dial := redis.NewDialer(&redis.Options{DialTimeout: timeout, TLSConfig: tlsConf})
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		g := &guardConn{Conn: cn, scan: respScanner{budget: budget}}
		// go-redis checks an idle connection's health by peeking at its
		// socket when the connection exposes one (internal/pool
		// conn_check.go connCheck); the guard holds no bytes back, so the
		// socket may be shown. A TLS connection shows none, as without
		// the guard.
		if sc, ok := cn.(syscall.Conn); ok {
			return sysGuardConn{g, sc}, nil
		}
		return g, nil
	}
}

// guardConn checks the RESP framing of what it reads.
type guardConn struct {
	net.Conn
	mu   sync.Mutex
	scan respScanner
	err  error // the refusal, returned by every later read
}

type sysGuardConn struct {
	*guardConn
	sc syscall.Conn
}

func (c sysGuardConn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }

func (c *guardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if n > 0 {
		if gerr := c.scan.feed(p[:n]); gerr != nil {
			c.err = gerr
			c.scan.release()
			_ = c.Conn.Close()
			return 0, gerr
		}
	}
	return n, err
}

func (c *guardConn) Close() error {
	c.mu.Lock()
	c.scan.release()
	c.mu.Unlock()
	return c.Conn.Close()
}

// respScanner follows RESP2 and RESP3 framing a byte at a time, holding
// no more than a few counters (the RESP3 specification,
// github.com/redis/redis-specifications specs/protocol/RESP3.md).
type respScanner struct {
	budget *replyBudget
	held   int64 // declared by the reply being read, held in budget

	state  uint8
	kind   byte // type of the header or line being read
	n      int64
	digits int
	neg    bool
	cr     bool
	line   int   // bytes of the line read so far
	bulk   int64 // bytes of a bulk body left, with its CRLF
	depth  int
	left   [maxReplyDepth]int64 // elements left in each open aggregate
}

const (
	scanType = iota
	scanLen
	scanLine
	scanBulk
)

func (s *respScanner) release() {
	if s.held != 0 {
		s.budget.inFlight.Add(-s.held)
		s.held = 0
	}
}

func (s *respScanner) feed(b []byte) error {
	for i := 0; i < len(b); {
		switch s.state {
		case scanType:
			s.kind = b[i]
			i++
			switch s.kind {
			case '$', '=', '!', '*', '~', '>', '%', '|':
				s.state, s.n, s.digits, s.neg, s.cr = scanLen, 0, 0, false, false
			case '+', '-', ':', '_', ',', '#', '(':
				s.state, s.line = scanLine, 0
			default:
				return refuse("unknown reply type %q", s.kind)
			}
		case scanLine:
			c := b[i]
			i++
			if s.line++; s.line > maxReplyLine {
				return refuse("a %q line longer than %d bytes", s.kind, maxReplyLine)
			}
			if c == '\n' {
				s.element()
			}
		case scanBulk:
			k := min(int64(len(b)-i), s.bulk)
			i += int(k)
			if s.bulk -= k; s.bulk == 0 {
				s.element()
			}
		case scanLen:
			c := b[i]
			i++
			if err := s.lenByte(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// lenByte reads one byte of a length or count header.
func (s *respScanner) lenByte(c byte) error {
	switch {
	case s.cr:
		if c != '\n' {
			return refuse("%q header not ended by CRLF", s.kind)
		}
		return s.header()
	case c == '\r':
		if s.digits == 0 || (s.neg && s.n != 1) {
			return refuse("%q header without a valid length", s.kind)
		}
		s.cr = true
	case c == '-' && s.digits == 0 && !s.neg:
		s.neg = true
	case c >= '0' && c <= '9':
		s.digits++
		s.n = s.n*10 + int64(c-'0')
		if s.n > s.budget.max {
			return refuse("%q header declares more than %d", s.kind, s.budget.max)
		}
	default:
		return refuse("%q header with %q in its length", s.kind, c)
	}
	return nil
}

// header acts on a complete length or count header.
func (s *respScanner) header() error {
	if s.neg { // -1: a RESP2 null
		s.element()
		return nil
	}
	switch s.kind {
	case '$', '=', '!':
		if err := s.charge(s.n + 2); err != nil {
			return err
		}
		s.state, s.bulk = scanBulk, s.n+2
		return nil
	}
	count, cost := s.n, s.n*elemCost
	switch s.kind {
	case '%':
		count, cost = 2*s.n, s.n*entryCost
	case '|': // the attribute's entries, then the reply they annotate
		count, cost = 2*s.n+1, s.n*entryCost
	}
	if count == 0 {
		s.element()
		return nil
	}
	if s.depth == maxReplyDepth {
		return refuse("aggregates nested deeper than %d", maxReplyDepth)
	}
	if err := s.charge(cost); err != nil {
		return err
	}
	s.left[s.depth] = count
	s.depth++
	s.state = scanType
	return nil
}

// charge takes cost from the shared budget for the reply being read.
func (s *respScanner) charge(cost int64) error {
	if cost > s.budget.max || s.budget.inFlight.Add(cost) > s.budget.max {
		if cost <= s.budget.max {
			s.budget.inFlight.Add(-cost)
		}
		return refuse("%q header declares %d bytes with %d already being read, past the bound of %d",
			s.kind, cost, s.budget.inFlight.Load(), s.budget.max)
	}
	s.held += cost
	return nil
}

// element ends one element; a reply ended whole frees what it held.
func (s *respScanner) element() {
	s.state = scanType
	for s.depth > 0 {
		if s.left[s.depth-1]--; s.left[s.depth-1] > 0 {
			return
		}
		s.depth--
	}
	s.release()
}
