package loadtest

import (
	"net"
	"path/filepath"
	"testing"
)

// TestStartOnFreePortsStartsAgainWhenAPortIsTaken starts a real
// redis-server first on a port this test holds, as another process can
// take a port between freePort's probe and the server's bind: the server
// exits saying the address is in use, and it is started again on new ports.
func TestStartOnFreePortsStartsAgainWhenAPortIsTaken(t *testing.T) {
	bin, err := redisBinary()
	if err != nil {
		t.Fatal(err)
	}
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	dir := t.TempDir()
	var tried []int
	s, err := startOnFreePorts(1, func(ports []int) (*server, error) {
		port := ports[0]
		if len(tried) == 0 {
			port = held.Addr().(*net.TCPAddr).Port
		}
		tried = append(tried, port)
		s, err := startRedisProcess(bin, port, dir, filepath.Join(dir, "redis.log"))
		if err != nil {
			return nil, err
		}
		return s, s.waitUntil(redisReady(loopback(port)))
	})
	if s != nil {
		defer s.stop()
	}
	if err != nil {
		t.Fatalf("started on %v: %v", tried, err)
	}
	if len(tried) != 2 {
		t.Fatalf("started on ports %v, want the held port and then a new one", tried)
	}
}
