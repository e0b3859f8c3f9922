package ports

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
)

// TestHoldRefusesAndTakesAListener: a held port refuses connections, as a
// dead server's does; a server listens on it while it is held, and only
// one: a second listener is refused the port.
func TestHoldRefusesAndTakesAListener(t *testing.T) {
	addr := Hold(t)
	wantErr(t, "dial to a held port", syscall.ECONNREFUSED, func() (io.Closer, error) { return net.Dial("tcp", addr) })
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on a held port: %v", err)
	}
	defer l.Close()
	wantErr(t, "a second listener on the port", syscall.EADDRINUSE, func() (io.Closer, error) { return net.Listen("tcp", addr) })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial to the listener on the held port: %v", err)
	}
	c.Close()
}

// wantErr fails the test unless open fails with want; what it opened
// otherwise is closed.
func wantErr(t *testing.T, what string, want error, open func() (io.Closer, error)) {
	t.Helper()
	c, err := open()
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, want) {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}
