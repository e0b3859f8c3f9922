package redistest

import (
	"bytes"
	"net"
	"strconv"
	"sync"
	"testing"
)

// LinkProxy forwards TCP connections to a Redis server and can freeze the
// replication stream that flows through it: a model of a replica that lags
// behind its primary, which is the window asynchronous replication leaves
// open. Ordinary clients pass through untouched even when frozen.
//
// A connection is a replication link once its client sent REPLCONF, PSYNC
// or SYNC (what a replica sends its primary on connecting). While the proxy
// is frozen, bytes from the server on such links are held back; Cut drops
// them and closes every connection, so a primary killed while frozen takes
// its unreplicated writes with it.
type LinkProxy struct {
	lis net.Listener

	mu     sync.Mutex
	target string
	frozen bool
	thawed *sync.Cond
	conns  map[*proxyConn]bool
	closed bool
}

// frozenLinkArgs are the arguments of every server whose replication a
// LinkProxy may freeze. A replica that has heard nothing from its primary
// for repl-timeout seconds (60 by default) drops the link ("MASTER timeout:
// no data nor PING received", redis/redis src/replication.c,
// replicationCron), and a test then waits in vain for a replica whose link
// is up; on a busy machine a freeze has outlasted a minute. An hour
// outlasts any test.
var frozenLinkArgs = []string{"--repl-timeout", "3600"}

type proxyConn struct {
	client, server net.Conn
	mu             sync.Mutex
	replication    bool
	dead           bool
}

// NewLinkProxy listens on a free loopback port; SetTarget says where to
// forward. It closes at cleanup.
func NewLinkProxy(t testing.TB) *LinkProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &LinkProxy{lis: lis, conns: map[*proxyConn]bool{}}
	p.thawed = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Port is the proxy's port.
func (p *LinkProxy) Port() int { return p.lis.Addr().(*net.TCPAddr).Port }

// SetTarget sets the address connections are forwarded to.
func (p *LinkProxy) SetTarget(addr string) {
	p.mu.Lock()
	p.target = addr
	p.mu.Unlock()
}

// SetTargetPort forwards to 127.0.0.1:port.
func (p *LinkProxy) SetTargetPort(port int) {
	p.SetTarget(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

// Freeze holds back, from now on, everything the server sends on
// replication links.
func (p *LinkProxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Cut closes every connection, dropping what is held back.
func (p *LinkProxy) Cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[*proxyConn]bool{}
	p.thawed.Broadcast()
	p.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// Close stops the proxy.
func (p *LinkProxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.lis.Close()
	p.Cut()
}

func (p *LinkProxy) accept() {
	for {
		client, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target, closed := p.target, p.closed
		p.mu.Unlock()
		if closed || target == "" {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", target)
		if err != nil {
			client.Close()
			continue
		}
		c := &proxyConn{client: client, server: server}
		p.mu.Lock()
		p.conns[c] = true
		p.mu.Unlock()
		go p.up(c)
		go p.down(c)
	}
}

// replicationCommands are the commands, as RESP bulk strings, that only a
// replica sends (replication.c syncWithMaster).
var replicationCommands = [][]byte{[]byte("$8\r\nREPLCONF\r\n"), []byte("$5\r\nPSYNC\r\n"), []byte("$4\r\nSYNC\r\n")}

// up copies client to server and spots replication links.
func (p *LinkProxy) up(c *proxyConn) {
	defer p.drop(c)
	buf := make([]byte, 32<<10)
	for {
		n, err := c.client.Read(buf)
		if n > 0 {
			upper := bytes.ToUpper(buf[:n])
			for _, cmd := range replicationCommands {
				if bytes.Contains(upper, cmd) {
					c.mu.Lock()
					c.replication = true
					c.mu.Unlock()
				}
			}
			if _, werr := c.server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// down copies server to client, holding bytes on a frozen replication link.
func (p *LinkProxy) down(c *proxyConn) {
	defer p.drop(c)
	buf := make([]byte, 32<<10)
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			if !p.waitForward(c) {
				return
			}
			if _, werr := c.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitForward blocks while c is a frozen replication link; false means the
// connection was cut meanwhile and the bytes must be dropped.
func (p *LinkProxy) waitForward(c *proxyConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		c.mu.Lock()
		repl, dead := c.replication, c.dead
		c.mu.Unlock()
		if dead || !p.conns[c] {
			return false
		}
		if !p.frozen || !repl {
			return true
		}
		p.thawed.Wait()
	}
}

func (p *LinkProxy) drop(c *proxyConn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.thawed.Broadcast()
	p.mu.Unlock()
	c.close()
}

func (c *proxyConn) close() {
	c.mu.Lock()
	c.dead = true
	c.mu.Unlock()
	_ = c.client.Close()
	_ = c.server.Close()
}
