package redisspec

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"time"
)

// Ping says whether a redis-server answers PING at addr (host:port), the
// deadline of the whole exchange a second: readiness checked on the port
// alone would take another process's listener for the server's. The test
// environments and the load tool start redis-server with it.
func Ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	// A password-protected server answers NOAUTH, which still proves it is up.
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("unexpected PING reply %q", line)
	}
	return nil
}
