package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
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
			// (attempt.TransportRefused).
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

// demoExample is a request the demo's front can send that a policy takes.
type demoExample struct {
	method, path string
	// host is the Host header to send; "" for the front's own.
	host    string
	headers [][2]string
	body    []byte
	// key is the key the request carries ("" when it is derived from the
	// body) and scope the scope the server reads, for idem-extproc admin.
	key, scope string
}

// curl writes ex as the curl command TestBinaryDemo parses (parseCurl).
func (ex demoExample) curl(front string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "curl -si -X %s %s", ex.method, shellQuote("http://"+front+ex.path))
	if ex.host != "" {
		fmt.Fprintf(&b, " -H %s", shellQuote("Host: "+ex.host))
	}
	for _, h := range ex.headers {
		fmt.Fprintf(&b, " -H %s", shellQuote(h[0]+": "+h[1]))
	}
	if ex.body != nil {
		fmt.Fprintf(&b, " -d %s", shellQuote(string(ex.body)))
	}
	return b.String()
}

// demoExampleFor derives from pol a request the demo's front sends to it
// with key: one that pol takes, and no policy listed before it (as the
// server picks: the first whose match holds, at the headers and, for body
// criteria, at the body). The error says why there is none.
// front is the front's host:port, the :authority of a request sent to it.
func demoExampleFor(set *policy.Set, pol *policy.Policy, front, key string) (demoExample, error) {
	ex := demoExample{key: key}
	if why := ex.target(pol); len(why) > 0 {
		return ex, errors.New(strings.Join(why, "; "))
	}
	body, why := ex.payload(pol)
	if len(why) > 0 {
		return ex, errors.New(strings.Join(why, "; "))
	}
	ex.body = mustJSON(body)
	ex.headers = append(ex.headers, [2]string{"content-type", "application/json"})
	switch pol.Scope.Source {
	case policy.ScopeAuthority:
		ex.scope = front
		if ex.host != "" {
			ex.scope = ex.host
		}
	case policy.ScopeHeader:
		ex.scope = "demo-tenant"
		ex.headers = append(ex.headers, [2]string{pol.Scope.Header, ex.scope})
	}

	if err := ex.takenBy(set, pol, front); err != nil {
		return ex, err
	}
	for _, w := range []string{ex.path, ex.host, string(ex.body)} {
		if strings.ContainsAny(w, "'\r\n") {
			return ex, fmt.Errorf("its request holds a quote or a line break, which the printed command does not quote: %q", w)
		}
	}
	return ex, nil
}

// target sets the example's method, path and host from pol's header
// criteria, and says why the demo's front cannot send a request pol takes,
// if it cannot.
func (ex *demoExample) target(pol *policy.Policy) (why []string) {
	// What the demo's front cannot send.
	switch pol.Scope.Source {
	case policy.ScopeMetadata:
		why = append(why, "scope.from: metadata reads Envoy's dynamic metadata (a JWT's sub, say), which the demo's front does not set")
	case policy.ScopePrincipal:
		why = append(why, "scope.from: principal reads the client's certificate, and the demo's front takes no TLS")
	}
	m := &pol.Match
	if len(m.RouteNames) > 0 && !slices.Contains(m.RouteNames, demoWriteRoute) {
		why = append(why, fmt.Sprintf("match.route_names: the demo's front has the routes of envoy/envoy.yaml, %s (every write) "+
			"and %s (reads, where the filter is off)", demoWriteRoute, demoReadRoute))
	}
	ex.method = http.MethodPost
	if len(m.Methods) > 0 {
		ex.method = ""
		for _, meth := range m.Methods {
			if !demoReadMethod(meth) {
				ex.method = meth
				break
			}
		}
		if ex.method == "" {
			why = append(why, "match.methods: the demo's front, as envoy/envoy.yaml, runs no GET, HEAD or OPTIONS through the filter")
		}
	}
	switch {
	case m.PathExact != "":
		ex.path = m.PathExact
	case m.PathPrefix != "":
		ex.path = m.PathPrefix
	case m.PathRegex != nil:
		why = append(why, "match.path.regex: the demo makes no path from a regular expression; send one it matches")
	default:
		ex.path = "/orders" // demo-orders creates an order there
	}
	if len(m.Hosts) > 0 {
		ex.host = m.Hosts[0]
		if suffix, ok := strings.CutPrefix(ex.host, "*"); ok {
			ex.host = "demo" + suffix
		}
	}
	if err := idem.CheckKey(ex.key, pol.MaxKeyLength); err != nil {
		why = append(why, fmt.Sprintf("key.max_length: the demo's key %q: %v", ex.key, err))
	}
	return why
}

// payload is the example's body: demo-orders' order, or a JSON-RPC call,
// with every member the policy reads, and the key where the policy reads
// it; why says what could not be set.
func (ex *demoExample) payload(pol *policy.Policy) (body map[string]any, why []string) {
	m := &pol.Match
	key := ex.key
	body = map[string]any{"item": "book", "qty": 1}
	if pol.Answers == policy.AnswersJSONRPC {
		body = map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
	}
	set1 := func(ptr jsonpointer.Pointer, v string) {
		if err := setPointer(body, ptr, v); err != nil {
			why = append(why, err.Error())
		}
	}
	for _, c := range m.JSON {
		set1(c.Pointer, c.OneOf[0])
	}
	sources := pol.KeySources
	if len(sources) == 0 {
		sources = []policy.KeySource{policy.KeyFromHeader}
	}
	switch sources[0] { // the first source that yields a key wins
	case policy.KeyFromHeader:
		ex.headers = append(ex.headers, [2]string{pol.KeyHeader, key})
	case policy.KeyFromBody:
		set1(pol.KeyPointer, key)
	case policy.KeyFromDerived:
		for _, ptr := range pol.KeyDerive {
			if !hasPointer(body, ptr) { // a match.json criterion may have set it
				set1(ptr, "demo")
			}
		}
		ex.key = ""
	}
	return body, why
}

// takenBy checks that the example's request is taken by pol, and not by a
// policy listed before it.
func (ex *demoExample) takenBy(set *policy.Set, pol *policy.Policy, front string) error {
	// The request as the server sees it, and the policy that takes it.
	authority := front
	if ex.host != "" {
		authority = ex.host
	}
	r := policy.Request{Method: ex.method, Authority: authority, Path: ex.path, RouteName: demoWriteRoute}
	// The server's own choice: the first policy whose header criteria hold,
	// then at the body the first candidate whose body criteria hold
	// (attempt.AtBody).
	for _, q := range set.BodyCandidates(r, set.Match(r)) {
		if _, miss := q.MatchBody(ex.body); miss != policy.BodyMatched {
			continue
		}
		if q != pol {
			return fmt.Errorf("the request made from it (%s %s) is taken by policy %q, listed before it", ex.method, ex.path, q.Name)
		}
		break
	}
	return nil
}

// setPointer sets the member ptr addresses in doc to v, making the objects
// on the way. Every token is a member name: RFC 6901 section 4 reads a
// token on an object as one, digits included.
func setPointer(doc map[string]any, ptr jsonpointer.Pointer, v string) error {
	toks := ptr.Tokens()
	if len(toks) == 0 {
		return fmt.Errorf("the pointer %q is the whole body, which cannot be a string and a JSON object", ptr)
	}
	cur := doc
	for i, tok := range toks {
		if i == len(toks)-1 {
			if old, ok := cur[tok]; ok {
				if s, isString := old.(string); !isString || s != v {
					return fmt.Errorf("%s is needed twice, with different values", ptr)
				}
			}
			cur[tok] = v
			return nil
		}
		next, ok := cur[tok].(map[string]any)
		if !ok {
			if _, taken := cur[tok]; taken {
				return fmt.Errorf("%s runs through a member that holds a value", ptr)
			}
			next = map[string]any{}
			cur[tok] = next
		}
		cur = next
	}
	return nil
}

// hasPointer reports whether ptr addresses a member of doc.
func hasPointer(doc map[string]any, ptr jsonpointer.Pointer) bool {
	var cur any = doc
	for _, tok := range ptr.Tokens() {
		obj, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = obj[tok]; !ok {
			return false
		}
	}
	return true
}

// mustJSON writes a body built of maps, strings and numbers, without
// escaping <, > and & (the body is a shell word, not HTML). Encoding such
// values cannot fail (encoding/json fails only on channels, functions,
// complex numbers, NaN and cycles).
func mustJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// shellQuote writes s as one sh word: as it is when it has nothing sh
// reads specially, else in single quotes, a quote inside it written '"'"'.
// (demoExampleFor refuses requests with quotes, so that the curl commands
// stay ones TestBinaryDemo's parser reads.)
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@,+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}
