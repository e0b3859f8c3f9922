package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/harness"
	"github.com/idem-extproc/idem-extproc/internal/testwait"
)

// TestBinaryDemo runs `idem-extproc demo` as a newcomer would, then runs the
// curl commands it printed, parsed from its output and sent with net/http,
// and checks each answer: a replay, a 422 and a 409, with the order counter
// showing what really ran. Each exchange is logged.
func TestBinaryDemo(t *testing.T) {
	cmd := exec.Command(binary(t), "demo", "--addr", "127.0.0.1:0")
	stderr := &harness.LogBuffer{}
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("demo stderr:\n%s", stderr.String())
		}
	})
	var printed []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && sc.Text() != "# ready" {
		printed = append(printed, sc.Text())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	t.Logf("the demo printed:\n%s", strings.Join(printed, "\n"))

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
	}
	arrivals := func() int { return strings.Count(stderr.String(), demoArrivedLine) }
	type answer struct {
		i    int
		resp *http.Response
		body string
	}
	var background []chan answer
	i, arrivedBefore := 0, 0
	check := func(a answer) {
		t.Helper()
		w := want[a.i]
		t.Logf("exchange %d: %s\n-> %d %s replayed=%q\n%s", a.i+1, printedCurl(printed, a.i), a.resp.StatusCode, a.resp.Header.Get("Content-Type"),
			a.resp.Header.Get("Idempotent-Replayed"), a.body)
		if a.resp.StatusCode != w.status || (a.resp.Header.Get("Idempotent-Replayed") == "true") != w.replayed ||
			(w.problem != "" && !strings.Contains(a.body, "#"+w.problem)) || (w.body != "" && strings.TrimSpace(a.body) != w.body) {
			t.Errorf("exchange %d: got %d replayed=%q %s; want %+v", a.i+1, a.resp.StatusCode, a.resp.Header.Get("Idempotent-Replayed"), a.body, w)
		}
		if w.status == 409 && a.resp.Header.Get("Retry-After") != "1" {
			t.Errorf("exchange %d: Retry-After %q, want 1", a.i+1, a.resp.Header.Get("Retry-After"))
		}
	}
	for _, line := range printed {
		switch {
		case strings.HasPrefix(line, "curl "):
			bg := strings.HasSuffix(line, " &")
			req, err := parseCurl(strings.TrimSuffix(line, " &"))
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			if i >= len(want) {
				t.Fatalf("the demo printed more commands than this test knows: %s", line)
			}
			send := func(i int) answer {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Errorf("%s: %v", line, err)
					return answer{i: i, resp: &http.Response{Header: http.Header{}}}
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return answer{i, resp, string(b)}
			}
			if bg {
				arrivedBefore = arrivals()
				c := make(chan answer, 1)
				background = append(background, c)
				go func(i int) { c <- send(i) }(i)
			} else {
				check(send(i))
			}
			i++
		case line == "sleep 1":
			// The printed command gives the background request a second
			// to be reserved; the test waits for it to reach the upstream
			// instead, which it does only after its reservation.
			testwait.Until(t, "the background request at the upstream", func() bool { return arrivals() > arrivedBefore })
		case line == "wait":
			for _, c := range background {
				check(<-c)
			}
			background = nil
		case line == "", strings.HasPrefix(line, "#"), strings.HasPrefix(line, "idem-extproc demo:"),
			strings.HasPrefix(line, "(in-memory"), strings.HasPrefix(line, "The server's"):
		default:
			t.Fatalf("the demo printed a line this test cannot run: %q", line)
		}
	}
	if i != len(want) {
		t.Fatalf("ran %d commands, want %d", i, len(want))
	}
	if n := arrivals(); n != 2 {
		t.Fatalf("%d POSTs reached the upstream, want 2: the first create and the slow one (no replay, 422 or 409)", n)
	}
}

func printedCurl(printed []string, n int) string {
	for _, l := range printed {
		if strings.HasPrefix(l, "curl ") {
			if n == 0 {
				return l
			}
			n--
		}
	}
	return ""
}

// parseCurl turns a printed `curl -si [-X M] 'URL' [-H 'h: v']... [-d 'body']`
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
		case strings.ContainsRune(`"\$`+"`", r):
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
