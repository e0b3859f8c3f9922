package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// slowStderr is a log output that takes its time on every write, as a full
// pipe to a container runtime does, so that lines queue in the server.
type slowStderr struct {
	harness.LogBuffer
}

func (s *slowStderr) Write(p []byte) (int, error) {
	time.Sleep(2 * time.Millisecond)
	return s.LogBuffer.Write(p)
}

// TestMainWritesEveryDecisionLineBeforeExit: the log lines of many
// decisions, queued behind a slow output when the server is told to stop,
// are all written, whole and with every decision field, before Main
// returns.
func TestMainWritesEveryDecisionLineBeforeExit(t *testing.T) {
	stderr := &slowStderr{}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	exited := make(chan int, 1)
	go func() {
		exited <- daemon.Main(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", ""},
			func(string) string { return "" }, stderr)
	}()
	var addr string
	testwait.Until(t, "the server serving", func() bool {
		for _, line := range strings.Split(stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "idem-extproc serving" {
				addr = m["listen"].(string)
				return true
			}
		}
		return false
	})
	env := harness.Start(t, harness.Options{ServerAddr: addr, Store: harness.Memory(memstore.Options{})})
	const clients, each = 8, 40
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if rep := env.Post("/orders", fmt.Sprintf("k-%d-%d", c, i), `{}`); rep.Status >= 300 {
					t.Errorf("POST = %d %s", rep.Status, rep.Body)
				}
			}
		}()
	}
	wg.Wait()
	stop()
	code := <-exited
	out := stderr.String() // what the process wrote before it would exit
	if code != 0 {
		t.Fatalf("Main exited %d", code)
	}
	reserved := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("mangled line %q: %v", line, err)
		}
		if m["msg"] != "decision" || m["decision"] != "reserved" {
			continue
		}
		for _, field := range []string{"time", "level", "policy", "key_hash", "scope", "request_id", "attempt", "latency_ms"} {
			if _, ok := m[field]; !ok {
				t.Errorf("decision line without %s: %s", field, line)
			}
		}
		reserved[m["key_hash"].(string)] = true
	}
	if len(reserved) != clients*each {
		t.Fatalf("%d reserved decision lines, want %d", len(reserved), clients*each)
	}
	if !strings.Contains(out, `"msg":"stopped"`) {
		t.Fatal("no stopped line: the lines after the drain are lost")
	}
}
