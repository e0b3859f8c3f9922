package harness

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestHoldPortRefuses: a held port refuses connections, as a dead
// server's does, and the server listens on it again once it is released.
func TestHoldPortRefuses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	held := holdPort(addr)
	if held == nil {
		t.Fatalf("holdPort(%s) failed", addr)
	}
	if c, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial to a held port: %v, want connection refused", err)
	}
	held.Close()
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen after the hold: %v", err)
	}
	l.Close()
}
