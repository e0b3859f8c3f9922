package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// TestDelayLinkDeliversWhatAClientGaveUpOn: a command written while the
// link holds the client's direction times out at the client, which closes
// its connection; once the link heals the command still reaches the
// server and runs, and the link reports the connection drained.
func TestDelayLinkDeliversWhatAClientGaveUpOn(t *testing.T) {
	srv := Start(t, Options{})
	link := NewDelayLink(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: link.Addr(), MaxRetries: -1, ReadTimeout: 50 * time.Millisecond,
		ContextTimeoutEnabled: true, DisableIdentity: true, Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	// A pooled connection, past its handshake. The 50 ms read timeout is
	// for the held SET below; a PING past it on a busy machine closes its
	// connection and is tried again on a new one.
	testwait.Until(t, "a PING answered through the link", func() bool { return c.Ping(ctx).Err() == nil })
	link.Hold(true, false)
	if err := c.Set(ctx, "late", "1", 0).Err(); err == nil {
		t.Fatal("SET answered while the link held it")
	}
	direct := srv.Client()
	if n, _ := direct.Exists(ctx, "late").Result(); n != 0 {
		t.Fatal("SET ran while the link held it")
	}
	testwait.Until(t, "the SET held", func() bool { return link.Held() > 0 })
	link.Release()
	testwait.Until(t, "the link drained", func() bool {
		closed, drained := link.Drained()
		return link.Held() == 0 && closed == 1 && drained == 1
	})
	if v, err := direct.Get(ctx, "late").Result(); err != nil || v != "1" {
		t.Fatalf("GET after the link healed = %q, %v; want the late SET's 1", v, err)
	}
}

// TestDelayLinkKeepsOrder: bytes that enter after the delay was lowered
// never overtake those still delayed on the same connection.
func TestDelayLinkKeepsOrder(t *testing.T) {
	srv := Start(t, Options{})
	link := NewDelayLink(t, srv.Addr())
	conn, err := net.Dial("tcp", link.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	set := func(v string) {
		t.Helper()
		if _, err := fmt.Fprintf(conn, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n%s\r\n", len(v), v); err != nil {
			t.Fatal(err)
		}
	}
	link.SetDelay(300*time.Millisecond, 0)
	set("first")
	testwait.Until(t, "the first SET in the link", func() bool { return link.Held() == 1 })
	link.SetDelay(0, 0)
	set("second")
	_ = conn.SetReadDeadline(time.Now().Add(testwait.Bound))
	r := bufio.NewReader(conn)
	for range 2 {
		if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
			t.Fatalf("reply %q, %v", line, err)
		}
	}
	if v, _ := srv.Client().Get(context.Background(), "k").Result(); v != "second" {
		t.Fatalf("k = %q, want second: the later SET overtook the delayed one", v)
	}
}

// TestDelayLinkJitterAndReset: jitter adds to the delay, never below it
// and never reordering a connection's replies; Reset cuts the
// connections open, and the link serves new ones.
func TestDelayLinkJitterAndReset(t *testing.T) {
	srv := Start(t, Options{})
	link := NewDelayLink(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: link.Addr(), MaxRetries: -1, PoolSize: 1,
		ContextTimeoutEnabled: true, DisableIdentity: true, Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	link.SetDelay(5*time.Millisecond, 5*time.Millisecond)
	link.SetJitter(10*time.Millisecond, 0)
	for i := range 10 {
		start := time.Now()
		got, err := c.Echo(ctx, fmt.Sprint(i)).Result()
		if err != nil || got != fmt.Sprint(i) {
			t.Fatalf("echo %d = %q, %v", i, got, err)
		}
		if d := time.Since(start); d < 10*time.Millisecond {
			t.Fatalf("round trip %v, below the two delays", d)
		}
	}
	before, err := c.ClientID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	link.Reset()
	// The client finds its connection dead (go-redis checks a pooled
	// connection before use) or fails once; either way the next
	// command runs on a new connection.
	_ = c.Ping(ctx).Err()
	after, err := c.ClientID(ctx).Result()
	if err != nil {
		t.Fatalf("after the reset: %v", err)
	}
	if after == before {
		t.Fatalf("client id %d before and after the reset: the connection was not cut", after)
	}
}
