package redistest

import (
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// DelayLink is a TCP link to a Redis server whose two directions can each
// be slowed down (a Redis far away) or held back entirely (a partition)
// and then let go (the partition heals). It models what a client's budget
// cannot see: a command written before the client gave up still reaches
// the server, late.
//
// Bytes keep their order in each direction. When a client closes its
// connection, what it sent before is still delivered, then the server's
// side is half-closed, as the kernel sends a closed socket's queued bytes
// before its FIN. The server answers, reads the end of the stream and
// closes its side; only then does the link count the connection as
// drained, so Drained tells a test that every command a closed
// connection carried has run.
type DelayLink struct {
	lis    net.Listener
	target string

	mu   sync.Mutex
	cond *sync.Cond
	// up is the client-to-server direction, down the server-to-client one.
	up, down direction
	// held counts chunks read from one side and not yet written to the
	// other, in both directions.
	held int
	// closed and drained count the connections whose client closed its
	// side, and those of them the server has closed since.
	closed, drained int
	// upReads counts the reads taken from clients: a client's writes sent
	// a round trip apart are separate reads, a pipeline usually one.
	upReads int
	conns   map[*linkConn]bool
	shut    bool
}

// direction is how one direction treats the bytes that enter it.
type direction struct {
	delay time.Duration
	// jitter adds up to this much to each read's delay, at random; bytes
	// still keep their order.
	jitter time.Duration
	hold   bool
}

type linkConn struct {
	client, server *net.TCPConn
	// clientDone and serverDone are set, under the link's lock, once each
	// side's stream has ended and its bytes have been passed on.
	clientDone, serverDone bool
}

// chunk is one read's bytes and when they may leave.
type chunk struct {
	b   []byte
	due time.Time
}

// NewDelayLink listens on a free loopback port and forwards every
// connection to target (host:port). It closes at cleanup.
func NewDelayLink(t testing.TB, target string) *DelayLink {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &DelayLink{lis: lis, target: target, conns: map[*linkConn]bool{}}
	l.cond = sync.NewCond(&l.mu)
	go l.accept()
	t.Cleanup(l.Close)
	return l
}

// Addr is the link's host:port.
func (l *DelayLink) Addr() string { return l.lis.Addr().String() }

// URL is a redis:// URL that reaches the server through the link.
func (l *DelayLink) URL() string { return "redis://" + l.Addr() }

// SetDelay delays, from now on, the bytes that enter each direction: up
// is client to server, down server to client. Bytes already in the link
// keep the delay they entered with; later bytes never overtake them.
func (l *DelayLink) SetDelay(up, down time.Duration) {
	l.mu.Lock()
	l.up.delay, l.down.delay = up, down
	l.mu.Unlock()
}

// SetJitter adds to each later read's delay a random part up to up and
// down, in each direction: a WAN's varying round trip.
func (l *DelayLink) SetJitter(up, down time.Duration) {
	l.mu.Lock()
	l.up.jitter, l.down.jitter = up, down
	l.mu.Unlock()
}

// Reset cuts every connection now, with a TCP reset (SO_LINGER 0) on both
// sides, as a middlebox or a peer's crash does; what was in the link is
// lost. The link keeps accepting connections.
func (l *DelayLink) Reset() {
	l.mu.Lock()
	conns := l.conns
	l.conns = map[*linkConn]bool{}
	l.mu.Unlock()
	for c := range conns {
		_ = c.client.SetLinger(0)
		_ = c.server.SetLinger(0)
		_ = c.client.Close()
		_ = c.server.Close()
	}
}

// Hold holds back every byte in the directions named (up: client to
// server, down: server to client), those in the link and those to come,
// until Release.
func (l *DelayLink) Hold(up, down bool) {
	l.mu.Lock()
	l.up.hold, l.down.hold = up, down
	l.mu.Unlock()
}

// Release lets everything held go on, in order.
func (l *DelayLink) Release() {
	l.mu.Lock()
	l.up.hold, l.down.hold = false, false
	l.cond.Broadcast()
	l.mu.Unlock()
}

// Held is the number of reads, in either direction, not yet passed on.
func (l *DelayLink) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// UpReads is how many reads the link has taken from its clients so far.
func (l *DelayLink) UpReads() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.upReads
}

// Drained reports the connections their clients closed (closed) and
// those of them whose every byte reached the server and that the server
// has closed in turn (drained).
func (l *DelayLink) Drained() (closed, drained int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed, l.drained
}

// Close stops the link and cuts every connection.
func (l *DelayLink) Close() {
	l.mu.Lock()
	l.shut = true
	conns := l.conns
	l.conns = map[*linkConn]bool{}
	l.cond.Broadcast()
	l.mu.Unlock()
	_ = l.lis.Close()
	for c := range conns {
		_ = c.client.Close()
		_ = c.server.Close()
	}
}

func (l *DelayLink) accept() {
	for {
		nc, err := l.lis.Accept()
		if err != nil {
			return
		}
		sc, err := net.DialTimeout("tcp", l.target, 5*time.Second)
		if err != nil {
			_ = nc.Close()
			continue
		}
		c := &linkConn{client: nc.(*net.TCPConn), server: sc.(*net.TCPConn)}
		l.mu.Lock()
		if l.shut {
			l.mu.Unlock()
			_ = nc.Close()
			_ = sc.Close()
			return
		}
		l.conns[c] = true
		l.mu.Unlock()
		go l.pipe(c, c.client, c.server, &l.up, true)
		go l.pipe(c, c.server, c.client, &l.down, false)
	}
}

// pipe copies from src to dst through dir: a reader queues each read with
// the time it may leave, the writer passes it on once due and not held.
// The one writer takes the reads in order, so later bytes, even with a
// shorter delay, never overtake earlier ones.
// At src's end of stream, dst is half-closed once everything queued has
// gone. fromClient marks the client-to-server direction; its end is the
// client closing, whose drain the other direction's end completes.
func (l *DelayLink) pipe(c *linkConn, src, dst *net.TCPConn, dir *direction, fromClient bool) {
	queue := make(chan chunk, 1024)
	go func() {
		defer close(queue)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				l.mu.Lock()
				due := time.Now().Add(dir.delay)
				if dir.jitter > 0 {
					due = due.Add(rand.N(dir.jitter))
				}
				l.held++
				if fromClient {
					l.upReads++
				}
				l.mu.Unlock()
				queue <- chunk{b: buf[:n], due: due}
			}
			if err != nil {
				return
			}
		}
	}()
	writable := true
	for ch := range queue {
		time.Sleep(time.Until(ch.due))
		l.mu.Lock()
		for dir.hold && !l.shut {
			l.cond.Wait()
		}
		l.mu.Unlock()
		if writable {
			if _, err := dst.Write(ch.b); err != nil {
				// The other side is gone (a client that gave up): keep
				// reading, so the server's end is still seen.
				writable = false
			}
		}
		l.mu.Lock()
		l.held--
		l.mu.Unlock()
	}
	_ = dst.CloseWrite()
	l.mu.Lock()
	defer l.mu.Unlock()
	if fromClient {
		c.clientDone = true
		l.closed++
	} else {
		c.serverDone = true
	}
	if !c.clientDone || !c.serverDone {
		return
	}
	// Both sides ended: the server read the client's end after running
	// every command the connection carried.
	l.drained++
	delete(l.conns, c)
	_ = c.client.Close()
	_ = c.server.Close()
}
