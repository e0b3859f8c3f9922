package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// demoReady ends every block the demo prints: at start and after each
// reload. TestBinaryDemo reads up to it.
const demoReady = "# ready"

// demoPrinter prints what the demo offers: at start, and again after each
// reload of --config, what each policy in force does with the commands
// that show it.
type demoPrinter struct {
	w io.Writer
	// front and admin are the front's and the admin listener's host:port.
	front, admin string
	// run is in every key the printed commands send (runID).
	run string
	// self runs this binary in the printed commands (demoSelf).
	self                                  string
	config, redisURL, tokenFile, upstream string

	mu sync.Mutex // one block at a time
	// blocks counts the policy listings printed, so that each one's keys
	// are new.
	blocks int
	// rejected is the last rejection printed, until a reload succeeds: the
	// watcher reads a rejected file again on its next change event (an
	// editor's rename makes several), and config.Source reports it again.
	rejected string
}

func (p *demoPrinter) start(set *policy.Set) {
	p.mu.Lock()
	defer p.mu.Unlock()
	store := "in-memory store"
	if p.redisURL != "" {
		store = "Redis at --redis-url"
	}
	policies := "built-in default policy"
	if p.config != "" {
		policies = "policies of " + p.config + ", reloaded when it changes"
	}
	upstream := "demo-orders"
	if p.upstream != "" {
		upstream = p.upstream
	}
	fmt.Fprintf(p.w, "idem-extproc demo: an Envoy-like front on http://%s runs every request through the idem-extproc server\n", p.front)
	fmt.Fprintf(p.w, "(%s, %s) to %s.\n", store, policies, upstream)
	fmt.Fprintf(p.w, "The server's /metrics and /readyz are on http://%s. Stop with Ctrl-C. In another terminal:\n\n", p.admin)
	if p.config == "" && p.upstream == "" {
		for _, s := range demoSteps("http://"+p.front, p.run) {
			fmt.Fprintf(p.w, "# %s\n", s.comment)
			for _, l := range s.lines {
				fmt.Fprintln(p.w, l)
			}
			fmt.Fprintln(p.w)
		}
	}
	p.policies(set)
	fmt.Fprintln(p.w, demoReady)
}

// reloaded is told of each reload of --config (daemon.Daemon.OnReload).
func (p *demoPrinter) reloaded(set *policy.Set, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil && err.Error() == p.rejected {
		return // said already
	}
	p.rejected = ""
	if err != nil {
		p.rejected = err.Error()
	}
	fmt.Fprintln(p.w)
	if err != nil {
		fmt.Fprintf(p.w, "# %s changed and was rejected; the policies in force stay as they were:\n", p.config)
		for _, l := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(p.w, "#   %s\n", l)
		}
	} else {
		fmt.Fprintf(p.w, "# %s changed and was reloaded.\n", p.config)
		p.policies(set)
	}
	fmt.Fprintln(p.w, demoReady)
}

// policies prints each policy in force: what decides a request's answer
// (config.Describe) and the commands that show it, or why the demo cannot
// make one.
func (p *demoPrinter) policies(set *policy.Set) {
	p.blocks++
	fmt.Fprintln(p.w, "# The policies in force, in match order: the first whose match holds takes a request.")
	if p.config != "" {
		fmt.Fprintf(p.w, "# Every setting of each: %s config check %s\n", p.self, shellQuote(p.config))
	}
	if len(set.Policies) == 0 {
		fmt.Fprintln(p.w, "# None: no request is protected.")
	}
	for i, pol := range set.Policies {
		fmt.Fprintf(p.w, "\n# Policy %d of %d:\n", i+1, len(set.Policies))
		desc, err := config.Describe(pol)
		if err != nil {
			desc = []byte(err.Error())
		}
		for _, l := range strings.Split(strings.TrimSuffix(string(desc), "\n"), "\n") {
			fmt.Fprintf(p.w, "#   %s\n", l)
		}
		key := fmt.Sprintf("demo-%s-%d-%d", p.run, p.blocks, i+1)
		ex, err := demoExampleFor(set, pol, p.front, key)
		demoOrders := p.upstream == "" && ex.method == http.MethodPost && ex.path == "/orders"
		if err == nil && p.upstream == "" && !demoOrders && pol.Answers == policy.AnswersJSONRPC {
			// demo-orders refuses any other request 404 or 405, with no
			// JSON-RPC response: the server takes that for an MCP transport
			// refusing the call, and stores nothing
			// (attempt.transportRefused).
			err = errors.New("answers: jsonrpc needs a JSON-RPC server upstream, and demo-orders is none; " +
				"run the demo with --upstream at your MCP server")
		}
		if err != nil {
			fmt.Fprintf(p.w, "# No example: %v.\n", err)
			continue
		}
		if p.upstream == "" && !demoOrders {
			fmt.Fprintf(p.w, "# demo-orders serves POST /orders only: it refuses %s %s (404 or 405), an answer stored\n"+
				"# like any other (--upstream sends it to your own API).\n", ex.method, ex.path)
		}
		p.example(pol, ex)
	}
	if p.tokenFile == "" {
		fmt.Fprintln(p.w, "\n# With --admin-token-file FILE (a file holding a token of your choice) the demo turns the admin API on\n"+
			"# and prints the idem-extproc admin commands that look each record up and purge it.")
	}
	fmt.Fprintln(p.w)
}

// example prints the commands that show what a policy does with ex.
func (p *demoPrinter) example(pol *policy.Policy, ex demoExample) {
	curl := ex.curl(p.front)
	switch pol.Enforcement {
	case policy.EnforcementOff:
		fmt.Fprintln(p.w, "# Send it twice: both run (enforcement: off only counts requests, and keeps no record).")
		fmt.Fprintln(p.w, curl)
		fmt.Fprintln(p.w, curl)
		return
	case policy.EnforcementShadow:
		fmt.Fprintln(p.w, "# Send it twice: both run (enforcement: shadow decides and records, never answers in the upstream's place).")
	default:
		fmt.Fprintln(p.w, "# Send it twice: the first runs, the second gets the stored answer with Idempotent-Replayed: true.")
	}
	fmt.Fprintln(p.w, curl)
	fmt.Fprintln(p.w, curl)
	if p.tokenFile == "" {
		return
	}
	if ex.key == "" {
		fmt.Fprintln(p.w, "# Its key is derived from the body: name its record by --id, the key_hash of the server's\n"+
			"# decision line (--log-level info), to look it up or purge it with idem-extproc admin.")
		return
	}
	fmt.Fprintln(p.w, "# Look its record up, purge it, and the same request runs again:")
	name := fmt.Sprintf("--addr http://%s --token-file %s --policy %s --scope %s --key %s",
		p.admin, shellQuote(p.tokenFile), shellQuote(pol.Name), shellQuote(ex.scope), shellQuote(ex.key))
	fmt.Fprintln(p.w, p.self+" admin get "+name)
	fmt.Fprintln(p.w, p.self+" admin purge "+name)
	fmt.Fprintln(p.w, curl)
}

// demoSelf is how the printed commands run this binary, which they do from
// another shell, perhaps in another directory: args0 is how it was started
// (os.Args[0]), exe where it is (os.Executable), and checkout whether the
// working directory is this repository's root.
func demoSelf(args0, exe string, checkout bool) string {
	switch {
	case checkout && goRunBuild(exe):
		// README.md's own path, go run ./cmd/idem-extproc demo, run again
		// where it works.
		return "go run ./cmd/idem-extproc"
	case args0 != "" && !strings.ContainsRune(args0, filepath.Separator):
		// Started by name: the shell found it on PATH, as the next one will.
		return args0
	}
	// A path works from any directory once absolute; a go run build's
	// lasts at least while the demo runs.
	return shellQuote(exe)
}

// goRunBuild reports whether exe was built by go run, which links into a
// temporary directory named go-build… (cmd/go/internal/work/action.go,
// Builder.Init and LinkAction: $WORK/b001/exe/NAME) or, since Go 1.24,
// keeps the executable in the build cache, by default a directory named
// go-build (cmd/go/internal/cache/default.go).
func goRunBuild(exe string) bool {
	for _, elem := range strings.Split(filepath.ToSlash(exe), "/") {
		if strings.HasPrefix(elem, "go-build") {
			return true
		}
	}
	return false
}

// demoSteps are the exchanges the demo prints first with demo-orders and
// the default policy, in order; TestBinaryDemo runs the printed commands.
// run makes the keys this run's.
func demoSteps(front, run string) []demoStep {
	create := `curl -si -X POST '` + front + `/orders' -H 'Idempotency-Key: order-` + run + `-1' -H 'Content-Type: application/json' -d '{"item":"book","qty":1}'`
	count := `curl -si '` + front + `/orders/count'`
	slow := `curl -si -X POST '` + front + `/orders?delay=3s' -H 'Idempotency-Key: order-` + run + `-2' -H 'Content-Type: application/json' -d '{"item":"pen","qty":1}'`
	lost := `curl -si -X POST '` + front + `/orders?drop' -H 'Idempotency-Key: order-` + run + `-3' -H 'Content-Type: application/json' -d '{"item":"ink","qty":1}'`
	return []demoStep{
		{comment: "1. Create an order, then send the same request again: the stored answer, marked\n#    idempotent-replayed: true. The counter shows one order.",
			lines: []string{create, create, count}},
		{comment: "2. Reuse the key for a different request: 422 idempotency-key-reused, nothing created.",
			lines: []string{strings.Replace(create, `"qty":1`, `"qty":2`, 1), count}},
		{comment: "3. Retry while the first attempt still runs (?delay=3s slows the upstream): 409 request-in-progress\n#    with Retry-After: 1; the first attempt completes, and the counter shows two orders.",
			lines: []string{slow + " &", "sleep 1", slow, "wait", count}},
		{comment: "4. Lose the answer (?drop: demo-orders creates the order, then closes the connection unanswered): the\n#    front answers 503 itself, so the outcome is unknown. The same request again is not run but answered\n#    409 outcome-unknown (read the order before acting again); the counter shows three orders.",
			lines: []string{lost, lost, count}},
	}
}

type demoStep struct {
	comment string
	lines   []string
}
