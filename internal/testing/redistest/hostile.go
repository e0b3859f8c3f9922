package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Hostile stands between a client and a real Redis and answers the
// commands an Attack targets with a reply of its own: what a compromised
// or broken store, or anything on a plain path to it, could send. Every
// other command goes to Redis and its reply comes back unchanged, one
// command at a time, so that an injected reply takes the place of exactly
// the one Redis would have sent.
type Hostile struct {
	lis    net.Listener
	target string

	mu     sync.Mutex
	attack Attack
	hits   int
	conns  map[net.Conn]bool
	closed bool
}

// Attack says which commands get which reply.
type Attack struct {
	// Commands are the command names answered by the attack (upper case,
	// e.g. "EVALSHA"); every command when empty.
	Commands []string
	// Reply is written in place of the real reply.
	Reply []byte
	// Repeat writes Reply this many times more, as one endless reply
	// would (a nesting that never ends), until the client hangs up.
	Repeat int
	// Drip writes the reply one byte at a time, this far apart.
	Drip time.Duration
	// Cut closes the connection after the reply.
	Cut bool
}

// The replies of the attacks the store's tests run.
var (
	// HugeBulk declares a string of 2^62 bytes.
	HugeBulk = []byte("$4611686018427387904\r\n")
	// HugeArray declares an array of 2^31 elements.
	HugeArray = []byte("*2147483648\r\n")
	// DeepNesting opens one array in another; Repeat makes it endless.
	DeepNesting = []byte("*1\r\n")
	// LongLine is a status line with no end.
	LongLine = []byte("+" + strings.Repeat("x", 1<<16))
)

// NewHostile listens on a free loopback port in front of the Redis at
// target (host:port). It passes everything through until SetAttack, and
// closes at cleanup.
func NewHostile(t testing.TB, target string) *Hostile {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &Hostile{lis: lis, target: target, conns: map[net.Conn]bool{}}
	go h.accept()
	t.Cleanup(h.Close)
	return h
}

// Addr is the proxy's host:port.
func (h *Hostile) Addr() string { return h.lis.Addr().String() }

// URL is a redis:// URL of the proxy.
func (h *Hostile) URL() string { return "redis://" + h.Addr() }

// SetAttack arms a; an empty Attack passes everything through again.
func (h *Hostile) SetAttack(a Attack) {
	h.mu.Lock()
	h.attack, h.hits = a, 0
	h.mu.Unlock()
}

// Hits is how many commands the attack answered since SetAttack.
func (h *Hostile) Hits() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hits
}

// Close stops listening and drops every connection.
func (h *Hostile) Close() {
	h.mu.Lock()
	h.closed = true
	for c := range h.conns {
		_ = c.Close()
	}
	h.mu.Unlock()
	_ = h.lis.Close()
}

func (h *Hostile) track(c net.Conn, add bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if add && h.closed {
		return false
	}
	if add {
		h.conns[c] = true
	} else {
		delete(h.conns, c)
	}
	return true
}

func (h *Hostile) accept() {
	for {
		c, err := h.lis.Accept()
		if err != nil {
			return
		}
		go h.serve(c)
	}
}

// serve relays one client's commands, answering the attacked ones itself.
func (h *Hostile) serve(client net.Conn) {
	server, err := net.DialTimeout("tcp", h.target, 5*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	if !h.track(client, true) || !h.track(server, true) {
		_ = client.Close()
		_ = server.Close()
		return
	}
	defer func() {
		_ = client.Close()
		_ = server.Close()
		h.track(client, false)
		h.track(server, false)
	}()
	fromClient, fromServer := bufio.NewReader(client), bufio.NewReader(server)
	for {
		var cmd bytes.Buffer
		name, err := readValue(fromClient, &cmd, 0)
		if err != nil {
			return
		}
		if a, ok := h.armed(name); ok {
			if h.inject(client, a) != nil || a.Cut {
				return
			}
			continue
		}
		if _, err := server.Write(cmd.Bytes()); err != nil {
			return
		}
		// Subscribed connections get messages unasked; the store's only
		// one (Watch's) is relayed as long as it lives.
		if name == "SUBSCRIBE" || name == "SSUBSCRIBE" || name == "PSUBSCRIBE" {
			go func() { _, _ = io.Copy(client, fromServer) }()
			for {
				cmd.Reset()
				if _, err := readValue(fromClient, &cmd, 0); err != nil {
					return
				}
				if _, err := server.Write(cmd.Bytes()); err != nil {
					return
				}
			}
		}
		var reply bytes.Buffer
		if _, err := readValue(fromServer, &reply, 0); err != nil {
			return
		}
		if _, err := client.Write(reply.Bytes()); err != nil {
			return
		}
	}
}

// armed returns the attack if it targets the command name.
func (h *Hostile) armed(name string) (Attack, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a := h.attack
	if a.Reply == nil {
		return a, false
	}
	hit := len(a.Commands) == 0
	for _, c := range a.Commands {
		hit = hit || c == name
	}
	if hit {
		h.hits++
	}
	return a, hit
}

// inject writes the attack's reply, repeated in writes of up to 64 KiB so
// that an endless reply arrives as fast as the client reads; a client
// that hangs up ends it.
func (h *Hostile) inject(c net.Conn, a Attack) error {
	if a.Drip > 0 {
		for range a.Repeat + 1 {
			for i := range a.Reply {
				if _, err := c.Write(a.Reply[i : i+1]); err != nil {
					return err
				}
				time.Sleep(a.Drip)
			}
		}
		return nil
	}
	per := max(1, min(a.Repeat+1, (64<<10)/max(1, len(a.Reply))))
	chunk := bytes.Repeat(a.Reply, per)
	for left := a.Repeat + 1; left > 0; left -= per {
		if _, err := c.Write(chunk[:min(left, per)*len(a.Reply)]); err != nil {
			return err
		}
	}
	return nil
}

// readValue copies one RESP value from r to w (what a client sends, or
// what a real Redis answers: trusted framing) and returns, for an array
// of bulk strings (a command), its first element in upper case.
func readValue(r *bufio.Reader, w *bytes.Buffer, depth int) (string, error) {
	if depth > 64 {
		return "", errors.New("redistest: nesting too deep")
	}
	line, err := r.ReadSlice('\n')
	if err != nil {
		return "", err
	}
	w.Write(line)
	if len(line) < 3 {
		return "", fmt.Errorf("redistest: short line %q", line)
	}
	n, _ := strconv.Atoi(string(line[1 : len(line)-2]))
	switch line[0] {
	case '$', '=', '!':
		if n < 0 {
			return "", nil
		}
		start := w.Len()
		if _, err := io.CopyN(w, r, int64(n)+2); err != nil {
			return "", err
		}
		return strings.ToUpper(string(w.Bytes()[start : start+n])), nil
	case '*', '~', '>', '%', '|':
		switch line[0] {
		case '%':
			n *= 2
		case '|':
			n = 2*n + 1
		}
		var first string
		for i := range n {
			s, err := readValue(r, w, depth+1)
			if err != nil {
				return "", err
			}
			if i == 0 {
				first = s
			}
		}
		return first, nil
	}
	return "", nil
}
