package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

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
	why := ex.target(pol)
	// The scope the front sends, or why it cannot.
	switch pol.Scope.Source {
	case policy.ScopeAuthority:
		ex.scope = front
		if ex.host != "" {
			ex.scope = ex.host
		}
	case policy.ScopeHeader:
		ex.scope = "demo-tenant"
		ex.headers = append(ex.headers, [2]string{pol.Scope.Header, ex.scope})
	case policy.ScopeMetadata:
		why = append(why, "scope.from: metadata reads Envoy's dynamic metadata (a JWT's sub, say), which the demo's front does not set")
	case policy.ScopePrincipal:
		why = append(why, "scope.from: principal reads the client's certificate, and the demo's front takes no TLS")
	}
	if len(why) > 0 {
		return ex, errors.New(strings.Join(why, "; "))
	}
	body, why := ex.payload(pol)
	if len(why) > 0 {
		return ex, errors.New(strings.Join(why, "; "))
	}
	ex.body = mustJSON(body)
	ex.headers = append(ex.headers, [2]string{"content-type", "application/json"})

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
	// (attempt.Request).
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
