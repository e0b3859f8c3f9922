package redisstore

import (
	"bufio"
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// fuzzMaxReply is the reply budget under fuzzing: small, so that what the
// guard lets through is cheap to allocate.
const fuzzMaxReply = 1 << 20

// FuzzRESPGuard drives any bytes, as a store's reply, through the guard
// and go-redis's reader into the store's own reply parsing: nothing
// panics, nothing allocates far past the reply budget, the guard's verdict
// does not depend on how the bytes are cut into reads, and it gives back
// all it held once the connection closes.
func FuzzRESPGuard(f *testing.F) {
	for _, seed := range []string{
		"+OK\r\n", ":1\r\n", "$5\r\nhello\r\n", "$-1\r\n", "*-1\r\n", "_\r\n", "#t\r\n", ",1.5\r\n", "(12345\r\n",
		"*4\r\n+completed\r\n:1\r\n:2\r\n$3\r\nabc\r\n", "*3\r\n+completed\r\n:1\r\n:2\r\n",
		"%2\r\n+s\r\n+i\r\n+a\r\n:1\r\n", "|1\r\n+k\r\n+v\r\n:1\r\n", ">3\r\n+message\r\n+c\r\n+p\r\n",
		"=8\r\ntxt:abcd\r\n", "!10\r\nERR boom!\r\n", "-ERR x\r\n",
		"$4611686018427387904\r\n", "*2147483648\r\n", "%1099511627776\r\n", "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
		"$1048576\r\n", "*0\r\n", "$-2\r\n", "$1x\r\n", "?5\r\n",
	} {
		f.Add([]byte(seed), uint8(3))
	}
	f.Fuzz(func(t *testing.T, reply []byte, cut uint8) {
		// The verdict, fed whole and fed in pieces.
		whole := respScanner{budget: newReplyBudget(fuzzMaxReply)}
		werr := whole.feed(reply)
		pieces := respScanner{budget: newReplyBudget(fuzzMaxReply)}
		var perr error
		step := int(cut%16) + 1
		for i := 0; i < len(reply) && perr == nil; i += step {
			perr = pieces.feed(reply[i:min(i+step, len(reply))])
		}
		if (werr == nil) != (perr == nil) || whole.held != pieces.held {
			t.Fatalf("whole: %v, %d held; in pieces of %d: %v, %d held", werr, whole.held, step, perr, pieces.held)
		}
		if whole.budget.inFlight.Load() > fuzzMaxReply {
			t.Fatalf("%d bytes held, past the budget", whole.budget.inFlight.Load())
		}
		whole.release()
		if n := whole.budget.inFlight.Load(); n != 0 {
			t.Fatalf("%d bytes still held after release", n)
		}

		// The reply read by go-redis and the store, through the guard.
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		v, err := fuzzCall(reply)
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 8*fuzzMaxReply {
			t.Fatalf("reading %q allocated %d bytes", reply, grew)
		}
		if err == nil {
			_, _ = parseReserve(v)
		}
	})
}

// fuzzCall sends one EVALSHA to a server that answers reply, through a
// client whose every connection is guarded with the fuzz budget.
func fuzzCall(reply []byte) ([]any, error) {
	budget := newReplyBudget(fuzzMaxReply)
	rdb := redis.NewClient(&redis.Options{
		Protocol: 2, DisableIdentity: true, MaxRetries: -1, DialerRetries: 1, PoolSize: 1,
		ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaintNotificationsConfig: noMaintNotifications(),
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			client, server := net.Pipe()
			go answer(server, reply)
			return &guardConn{Conn: client, scan: respScanner{budget: budget}}, nil
		},
	})
	defer rdb.Close()
	return rdb.EvalSha(context.Background(), "0000000000000000000000000000000000000000", []string{"k"}).Slice()
}

// answer refuses the client's HELLO as a Redis before 6 does (go-redis
// then goes on in RESP2: redis.go initConn), answers the next command
// with reply, and hangs up.
func answer(c net.Conn, reply []byte) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	r := bufio.NewReader(c)
	for _, out := range [][]byte{[]byte("-ERR unknown command 'HELLO'\r\n"), reply} {
		if skipCommand(r) != nil {
			return
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}
