// Package ports gives tests loopback TCP ports that no other process takes
// while the test runs.
//
// A port found free by listening on port 0 and closing the listener is
// free only until another process takes it, and the tests of several
// packages run side by side, each making connections whose local ports
// come from the same range. Hold keeps the port bound, without listening,
// for the rest of the test: no port picker hands it out, while a server
// the test starts on it still binds it and listens.
package ports

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// Hold returns "127.0.0.1:N" for a port the kernel picks, bound without
// listening for the rest of the test; it fails the test when it cannot.
//
// While it is held, no port picker hands the port out: an outgoing
// connection's automatic port skips every port bound by bind()
// (Linux net/ipv4/inet_hashtables.c, __inet_hash_connect), and a listener
// asking for any free port skips it as a conflict
// (net/ipv4/inet_connection_sock.c, inet_csk_find_open_port, which checks
// without relaxing SO_REUSEADDR). A server still binds it and listens:
// two sockets that both set SO_REUSEADDR conflict on an explicit bind only
// when the other one listens (inet_connection_sock.c, inet_bind_conflict),
// and Go's listeners (net/sockopt_linux.go, setDefaultListenerSockopts) and
// redis-server's (anet.c, _anetTcpServer) set it. A connection to it is
// refused while nothing listens, as to a dead server's port: a SYN that
// finds no listening socket is answered with a reset (net/ipv4/tcp_ipv4.c,
// tcp_v4_rcv, no_tcp_socket).
func Hold(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(HoldPort(tb)))
}

// HoldPort is Hold's port number.
func HoldPort(tb testing.TB) int {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("ports: %v", err)
	}
	tb.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		tb.Fatalf("ports: SO_REUSEADDR: %v", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatalf("ports: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatalf("ports: %v", err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}
