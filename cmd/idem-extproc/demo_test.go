package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// demoRun is a running `idem-extproc demo` whose stdout is read line by
// line as it comes, so that the test waits for each printed block with a
// bound (testwait) rather than blocking on the pipe.
type demoRun struct {
	t      *testing.T
	stderr *harness.LogBuffer
	mu     sync.Mutex
	lines  []string
	// read is how many lines the blocks taken so far hold.
	read int
	// exited is closed when the process has ended, with exitErr set.
	exited  chan struct{}
	exitErr error
}

// startDemo runs the binary's demo with args after --addr 127.0.0.1:0.
func startDemo(t *testing.T, args ...string) *demoRun {
	t.Helper()
	return startDemoIn(t, "", args...)
}

// startDemoIn is startDemo in the working directory dir ("": the test's).
func startDemoIn(t *testing.T, dir string, args ...string) *demoRun {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"demo", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Dir = dir
	d := &demoRun{t: t, stderr: &harness.LogBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = d.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.mu.Lock()
			d.lines = append(d.lines, sc.Text())
			d.mu.Unlock()
		}
		// Wait only once stdout is read to its end (os/exec: Wait closes
		// the pipe).
		d.exitErr = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-d.exited
		if t.Failed() {
			d.mu.Lock()
			t.Logf("demo stdout:\n%s", strings.Join(d.lines, "\n"))
			d.mu.Unlock()
			t.Logf("demo stderr:\n%s", d.stderr.String())
		}
	})
	return d
}

// block waits for the demo's next block, the lines up to demoReady.
func (d *demoRun) block() []string {
	d.t.Helper()
	var out []string
	ended := false
	testwait.Until(d.t, "the demo's next block", func() bool {
		select {
		case <-d.exited:
			ended = true
			return true
		default:
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		for i := d.read; i < len(d.lines); i++ {
			if d.lines[i] == demoReady {
				out = append([]string(nil), d.lines[d.read:i]...)
				d.read = i + 1
				return true
			}
		}
		return false
	})
	if ended {
		d.t.Fatalf("the demo ended (%v) before printing its next block", d.exitErr)
	}
	d.t.Logf("the demo printed:\n%s", strings.Join(out, "\n"))
	return out
}

// arrivals counts the POST /orders that reached demo-orders.
func (d *demoRun) arrivals() int { return strings.Count(d.stderr.String(), demoArrivedLine) }

// TestBinaryDemo runs `idem-extproc demo` as a newcomer would, then runs the
// curl commands it printed, parsed from its output and sent with net/http,
// and checks each answer: a replay, a 422, a 409 request-in-progress and a
// 409 outcome-unknown, with the order counter showing what really ran; then
// the default policy's own example. Each exchange is logged.
func TestBinaryDemo(t *testing.T) {
	d := startDemo(t)
	printed := d.block()
	steps, policies := splitDemoBlock(t, printed)
	runDemoSteps(t, d, steps)
	testwait.Until(t, "the upstream's arrival lines", func() bool { return d.arrivals() >= 3 })
	if n := d.arrivals(); n != 3 {
		t.Fatalf("%d POSTs reached the upstream, want 3: the first create, the slow one and the lost one (no replay, 422 or 409)", n)
	}
	got := runPolicyExamples(t, policies, demoOrdersHits(d))
	if want := map[string]string{"default": ""}; !sameOutcomes(got, want) {
		t.Fatalf("policies printed %v, want %v", got, want)
	}
	if !strings.Contains(strings.Join(policies, "\n"), "--admin-token-file FILE") {
		t.Error("without --admin-token-file the demo does not say how to get the admin commands")
	}
}

// splitDemoBlock parses the first block: the heading, the steps printed
// with demo-orders and the default policy, and the policies section.
func splitDemoBlock(t *testing.T, printed []string) (steps, policies []string) {
	t.Helper()
	for i, l := range printed {
		if strings.HasPrefix(l, "# The policies in force") {
			return printed[:i], printed[i:]
		}
	}
	t.Fatal("no policies section")
	return nil, nil
}

// runDemoSteps runs the replay, 422 and 409 steps as printed.
func runDemoSteps(t *testing.T, d *demoRun, printed []string) {
	t.Helper()
	// What each curl command, in printed order, must get back.
	want := []struct {
		status   int
		replayed bool
		problem  string
		body     string
	}{
		{status: 201},
		{status: 201, replayed: true},
		{status: 200, body: `{"orders_created":1}`},
		{status: 422, problem: "idempotency-key-reused"},
		{status: 200, body: `{"orders_created":1}`},
		{status: 201}, // the slow first attempt, in the background
		{status: 409, problem: "request-in-progress"},
		{status: 200, body: `{"orders_created":2}`},
		{status: 503}, // the answer lost
		{status: 409, problem: "outcome-unknown"},
		{status: 200, body: `{"orders_created":3}`},
	}
	var background []chan demoAnswer
	i, arrivedBefore := 0, 0
	check := func(a demoAnswer) {
		t.Helper()
		w := want[a.i]
		if a.status != w.status || a.replayed != w.replayed ||
			(w.problem != "" && !strings.Contains(a.body, "#"+w.problem)) || (w.body != "" && strings.TrimSpace(a.body) != w.body) {
			t.Errorf("exchange %d: got %d replayed=%v %s; want %+v", a.i+1, a.status, a.replayed, a.body, w)
		}
		if w.problem == "request-in-progress" && a.header.Get("Retry-After") != "1" {
			t.Errorf("exchange %d: Retry-After %q, want 1", a.i+1, a.header.Get("Retry-After"))
		}
	}
	for _, line := range printed {
		switch {
		case strings.HasPrefix(line, "curl "):
			if i >= len(want) {
				t.Fatalf("the demo printed more commands than this test knows: %s", line)
			}
			if bg := strings.HasSuffix(line, " &"); bg {
				arrivedBefore = d.arrivals()
				c := make(chan demoAnswer, 1)
				background = append(background, c)
				go func(i int) { c <- sendCurl(t, i, strings.TrimSuffix(line, " &")) }(i)
			} else {
				check(sendCurl(t, i, line))
			}
			i++
		case line == "sleep 1":
			// The printed command gives the background request a second
			// to be reserved; the test waits for it to reach the upstream
			// instead, which it does only after its reservation.
			testwait.Until(t, "the background request at the upstream", func() bool { return d.arrivals() > arrivedBefore })
		case line == "wait":
			for _, c := range background {
				check(<-c)
			}
			background = nil
		case line == "", strings.HasPrefix(line, "#"), strings.HasPrefix(line, "idem-extproc demo:"),
			strings.HasPrefix(line, "("), strings.HasPrefix(line, "The server's"):
		default:
			t.Fatalf("the demo printed a line this test cannot run: %q", line)
		}
	}
	if i != len(want) {
		t.Fatalf("ran %d commands, want %d", i, len(want))
	}
}

// demoAnswer is what a printed curl command got.
type demoAnswer struct {
	i        int
	status   int
	replayed bool
	header   http.Header
	body     string
}

// sendCurl sends a printed curl command (the i-th, for the log) and logs
// the exchange; a transport error fails the test and reads as status 0.
func sendCurl(t *testing.T, i int, line string) demoAnswer {
	req, err := parseCurl(line)
	if err != nil {
		t.Errorf("%s: %v", line, err)
		return demoAnswer{i: i, header: http.Header{}}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("%s: %v", line, err)
		return demoAnswer{i: i, header: http.Header{}}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := demoAnswer{i: i, status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", header: resp.Header, body: string(b)}
	t.Logf("exchange %d: %s\n-> %d %s replayed=%v\n%s", i+1, line, a.status, resp.Header.Get("Content-Type"), a.replayed, a.body)
	return a
}

// runAdmin runs a printed `... admin ...` command as a shell would, with
// the program it names, and returns its stdout, failing the test unless it
// exits 0.
func runAdmin(t *testing.T, line string) string {
	t.Helper()
	words, err := shellWords(line)
	if err != nil || !isAdminCommand(line) {
		t.Fatalf("not an admin command this test runs: %q (%v)", line, err)
	}
	cmd := exec.Command(words[0], words[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s%s", line, err, stdout.String(), stderr.String())
	}
	t.Logf("%s\n-> %s", line, stdout.String())
	return stdout.String()
}

// isAdminCommand reports whether a printed line is an admin get or purge
// command, whatever runs the binary (demoSelf).
func isAdminCommand(line string) bool {
	return strings.Contains(line, " admin get ") || strings.Contains(line, " admin purge ")
}

// hitCounter reports how many requests of method and path reached the
// upstream, when it can tell.
type hitCounter func(method, path string) (n int, known bool)

// demoOrdersHits counts, of the requests reaching demo-orders, the POST
// /orders (the demo logs each).
func demoOrdersHits(d *demoRun) hitCounter {
	return func(method, path string) (int, bool) {
		if method != http.MethodPost || path != "/orders" {
			return 0, false
		}
		return d.arrivals(), true
	}
}

// runPolicyExamples runs, for each policy the section lists, the commands
// printed under it, and checks what they get: the first request runs, the
// same request again is the stored answer, replayed (an enforcing policy);
// the record then looks as the first answer left it, is purged, and the
// request runs again. It returns, by policy name, "" for a policy whose
// commands ran and the reason printed for one without an example.
func runPolicyExamples(t *testing.T, section []string, hits hitCounter) map[string]string {
	t.Helper()
	type policyBlock struct {
		name, enforcement, noExample string
		cmds                         []string
	}
	var blocks []*policyBlock
	var cur *policyBlock
	for _, l := range section {
		switch {
		case strings.HasPrefix(l, "# Policy "):
			cur = &policyBlock{}
			blocks = append(blocks, cur)
		case cur == nil:
		case strings.HasPrefix(l, "#   name: "):
			cur.name = strings.Trim(strings.TrimPrefix(l, "#   name: "), `'"`)
		case strings.HasPrefix(l, "#   enforcement: "):
			cur.enforcement = strings.TrimPrefix(l, "#   enforcement: ")
		case strings.HasPrefix(l, "# No example: "):
			cur.noExample = strings.TrimPrefix(l, "# No example: ")
		case strings.HasPrefix(l, "curl "), isAdminCommand(l):
			cur.cmds = append(cur.cmds, l)
		case l == "", strings.HasPrefix(l, "#"):
		default:
			t.Fatalf("the demo printed a line this test cannot run: %q", l)
		}
	}
	out := map[string]string{}
	for _, b := range blocks {
		if b.name == "" {
			t.Fatalf("a policy printed without its name: %+v", b)
		}
		out[b.name] = b.noExample
		if b.noExample != "" {
			if len(b.cmds) > 0 {
				t.Errorf("policy %q: commands printed with no example: %q", b.name, b.cmds)
			}
			continue
		}
		runPolicyBlock(t, b.name, b.enforcement, b.cmds, hits)
	}
	return out
}

// runPolicyBlock runs one policy's commands: curl, curl, then with the
// admin API admin get, admin purge, curl.
func runPolicyBlock(t *testing.T, name, enforcement string, cmds []string, hits hitCounter) {
	t.Helper()
	withAdmin := len(cmds) == 5
	if (len(cmds) != 2 && !withAdmin) || !strings.HasPrefix(cmds[0], "curl ") || cmds[1] != cmds[0] ||
		(withAdmin && (!strings.Contains(cmds[2], " admin get ") || !strings.Contains(cmds[3], " admin purge ") || cmds[4] != cmds[0])) {
		t.Fatalf("policy %q: printed %q; want a curl command twice, then admin get, admin purge and the curl command again", name, cmds)
	}
	req, err := parseCurl(cmds[0])
	if err != nil {
		t.Fatal(err)
	}
	hitsBefore, known := hits(req.Method, req.URL.Path)
	first := sendCurl(t, 0, cmds[0])
	if first.status == 0 || first.replayed || strings.HasPrefix(first.header.Get("Content-Type"), "application/problem+json") {
		t.Fatalf("policy %q: the first request got %d replayed=%v %s; want the upstream's answer", name, first.status, first.replayed, first.body)
	}
	again := sendCurl(t, 1, cmds[1])
	ran := 1
	if enforcement == "enforce" {
		if !again.replayed || again.status != first.status || again.body != first.body {
			t.Errorf("policy %q: the same request again got %d replayed=%v %s; want the first answer replayed", name, again.status, again.replayed, again.body)
		}
	} else {
		ran++
		if again.replayed {
			t.Errorf("policy %q (enforcement: %s): the same request again was replayed", name, enforcement)
		}
	}
	if withAdmin {
		var rec struct {
			State    string `json:"state"`
			Response struct {
				Status int `json:"status"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(runAdmin(t, cmds[2])), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.State != "completed" || rec.Response.Status != first.status {
			t.Errorf("policy %q: admin get shows %+v; want completed with status %d", name, rec, first.status)
		}
		if out := runAdmin(t, cmds[3]); !strings.Contains(out, `"purged"`) {
			t.Errorf("policy %q: admin purge says %s", name, out)
		}
		third := sendCurl(t, 2, cmds[4])
		ran++
		if third.replayed || third.status != first.status {
			t.Errorf("policy %q: after the purge the request got %d replayed=%v; want it run again (%d)", name, third.status, third.replayed, first.status)
		}
	}
	if known {
		// demo-orders' arrival lines go through the background log
		// writer: they may come after the answer.
		testwait.Until(t, "the upstream's arrival lines", func() bool { n, _ := hits(req.Method, req.URL.Path); return n-hitsBefore >= ran })
		if n, _ := hits(req.Method, req.URL.Path); n-hitsBefore != ran {
			t.Errorf("policy %q: %d of its requests reached the upstream, want %d", name, n-hitsBefore, ran)
		}
	}
}

// sameOutcomes compares runPolicyExamples' result with want, where a
// reason in want need only be contained in the printed one.
func sameOutcomes(got, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok || (w == "") != (g == "") || !strings.Contains(g, w) {
			return false
		}
	}
	return true
}

func printedLine(block []string, prefix string) string {
	for _, l := range block {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// parseCurl turns a printed `curl -si [-X M] URL [-H 'h: v']... [-d 'body']`
// into the request it sends; anything else is refused, so the printed
// commands stay ones this test can run.
func parseCurl(line string) (*http.Request, error) {
	words, err := shellWords(line)
	if err != nil {
		return nil, err
	}
	method, target, body := "", "", ""
	var headers [][2]string
	for j := 1; j < len(words); j++ {
		switch w := words[j]; {
		case w == "-si":
		case w == "-X" || w == "-H" || w == "-d":
			if j+1 >= len(words) {
				return nil, fmt.Errorf("%s without a value", w)
			}
			j++
			switch w {
			case "-X":
				method = words[j]
			case "-H":
				name, value, ok := strings.Cut(words[j], ":")
				if !ok {
					return nil, fmt.Errorf("header %q", words[j])
				}
				headers = append(headers, [2]string{name, strings.TrimSpace(value)})
			case "-d":
				body = words[j]
			}
		case strings.HasPrefix(w, "http://") && target == "":
			target = w
		default:
			return nil, fmt.Errorf("unexpected word %q", w)
		}
	}
	if method == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	for _, h := range headers {
		if strings.EqualFold(h[0], "Host") {
			req.Host = h[1] // as curl sends it: net/http ignores a Host in Header
			continue
		}
		req.Header.Add(h[0], h[1])
	}
	return req, nil
}

// shellWords splits a line as sh would, for words that are plain or in
// single quotes (all the printed commands use).
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case quoted && r == '\'':
			quoted = false
		case quoted:
			cur.WriteRune(r)
		case r == '\'':
			quoted, inWord = true, true
		case r == ' ':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case strings.ContainsRune(`"\$`+"`&|;<>()*?[]{}~#", r):
			return nil, fmt.Errorf("%q outside single quotes", r)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unclosed quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
