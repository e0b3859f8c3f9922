package redisstore

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// replyingServer is a Redis stand-in on loopback that answers every
// command with one fixed RESP reply, so that go-redis parses a real reply
// of each kind into the error value it returns in production.
func replyingServer(t *testing.T, reply string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if err := skipCommand(r); err != nil {
						return
					}
					if _, err := io.WriteString(c, reply); err != nil {
						return
					}
				}
			}()
		}
	}()
	return lis.Addr().String()
}

// skipCommand reads one RESP array of bulk strings, a client's command.
func skipCommand(r *bufio.Reader) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil {
		return err
	}
	for range 2 * n { // each element: its $length line, then its bytes
		if _, err := r.ReadString('\n'); err != nil {
			return err
		}
	}
	return nil
}

// TestErrorClasses: each reply a Redis node may send, as go-redis returns
// it, lands in its class, and the store's decisions follow the class.
func TestErrorClasses(t *testing.T) {
	for _, tc := range []struct {
		reply             string
		class             errClass
		retried, topology bool
	}{
		{"-LOADING Redis is loading the dataset in memory\r\n", errBusy, true, true},
		{"-CLUSTERDOWN The cluster is down\r\n", errBusy, true, true},
		{"-TRYAGAIN Multiple keys request during rehashing of slot\r\n", errBusy, true, true},
		{"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n", errBusy, true, true},
		{"-READONLY You can't write against a read only replica.\r\n", errReadOnly, true, true},
		{"-MOVED 3999 127.0.0.1:6381\r\n", errRedirect, false, true},
		{"-ASK 3999 127.0.0.1:6381\r\n", errRedirect, false, true},
		{"-NOREPLICAS Not enough good replicas to write.\r\n", errNoReplicas, true, false},
		{"-ERR max number of clients reached\r\n", errMaxClients, true, false},
		{"-OOM command not allowed when used memory > 'maxmemory'.\r\n", errOOM, false, false},
		{"-NOSCRIPT No matching script. Please use EVAL.\r\n", errNoScript, false, false},
		{"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n", errWrongType, false, false},
		{"-ERR unknown command 'X'\r\n", errReply, false, false},
	} {
		name, _, _ := strings.Cut(strings.TrimPrefix(tc.reply, "-"), " ")
		t.Run(name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: replyingServer(t, tc.reply), Protocol: 2,
				DisableIdentity: true, MaxRetries: -1, ReadTimeout: time.Second, WriteTimeout: time.Second})
			defer rdb.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := rdb.Get(ctx, "k").Err()
			if err == nil {
				t.Fatal("no error")
			}
			if got := classify(err); got != tc.class {
				t.Fatalf("%q: class %d, want %d", err, got, tc.class)
			}
			if retryAlone(err) != tc.retried || topologyChanged(err) != tc.topology {
				t.Fatalf("%q: retried %v topology changed %v, want %v %v", err, retryAlone(err), topologyChanged(err), tc.retried, tc.topology)
			}
		})
	}
	t.Run("connection refused", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := lis.Addr().String()
		_ = lis.Close()
		rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
		defer rdb.Close()
		err = rdb.Get(context.Background(), "k").Err()
		if classify(err) != errConn || !retryAlone(err) || !topologyChanged(err) {
			t.Fatalf("%v: class %d", err, classify(err))
		}
	})
	t.Run("context", func(t *testing.T) {
		err := errors.Join(errors.New("call"), context.DeadlineExceeded)
		if classify(err) != errContext || retryAlone(err) || topologyChanged(err) {
			t.Fatalf("%v: class %d", err, classify(err))
		}
	})
}
