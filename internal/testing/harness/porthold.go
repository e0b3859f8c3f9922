package harness

import (
	"net/netip"
	"os"
	"syscall"
)

// holdPort binds a TCP socket to addr (an IPv4 address and port) without
// listening on it, and returns it; nil when it cannot, and the caller goes
// on without the hold. While it is held, no port picker hands it out: an
// outgoing connection's automatic port skips every port bound by bind() (Linux net/ipv4/inet_hashtables.c, __inet_hash_connect), and a
// listener asking for any free port skips it as a conflict
// (net/ipv4/inet_connection_sock.c, inet_csk_find_open_port). A connection
// to it is still refused, as to a dead server's port: a SYN that finds no
// listening socket is answered with a reset (net/ipv4/tcp_ipv4.c,
// tcp_v4_rcv, no_tcp_socket). SO_REUSEADDR lets the bind succeed beside
// the stopped server's connections left in TIME_WAIT on the port.
func holdPort(addr string) *os.File {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	if syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) != nil ||
		syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}) != nil {
		syscall.Close(fd)
		return nil
	}
	return os.NewFile(uintptr(fd), "held "+addr)
}
