package main

import (
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// TestDemoExampleFor: the request the demo derives from a policy carries
// everything the policy reads (method, host, path, key, scope, body
// members) and is taken by that policy; when the demo's front cannot send
// one, or an earlier policy would take it, the reason names the setting.
func TestDemoExampleFor(t *testing.T) {
	const front = "127.0.0.1:8080"
	for _, c := range []struct {
		name, policy string
		// want are parts of the curl command; why is part of the reason
		// there is none.
		want []string
		why  string
		// key and scope are what idem-extproc admin names the record by.
		key, scope string
	}{
		{name: "by host wildcard and exact path",
			policy: `{name: p, match: {hosts: ['*.pay.example.com'], methods: [GET, PUT], path: {exact: /v1/charges}}}`,
			want:   []string{"-X PUT ", "http://" + front + "/v1/charges", "'Host: demo.pay.example.com'", "'idempotency-key: K1'"},
			key:    "K1", scope: "demo.pay.example.com"},
		{name: "host with a port", policy: `{name: p, match: {hosts: ['api.example.com:8443']}}`,
			want: []string{"-X POST ", "'Host: api.example.com:8443'"}, key: "K1", scope: "api.example.com:8443"},
		{name: "key header and scope header",
			policy: `{name: p, match: {path: {prefix: /t}}, key: {header: X-Key}, scope: {from: header, header: X-Tenant}}`,
			want:   []string{"/t ", "'x-key: K1'", "'x-tenant: demo-tenant'"}, key: "K1", scope: "demo-tenant"},
		{name: "no scope", policy: `{name: p, match: {methods: [DELETE]}, scope: {from: none}}`,
			want: []string{"-X DELETE "}, key: "K1", scope: ""},
		{name: "route of the front", policy: `{name: p, match: {route_names: [orders-write, other]}}`,
			want: []string{"/orders "}, key: "K1", scope: front},
		{name: "key in the body and body criteria",
			policy: `{name: p, match: {methods: [POST], json: [{pointer: /a/b, equals: x}, {pointer: /0, one_of: [y, z]}]}, key: {from: [body, header], pointer: /meta/key}}`,
			want:   []string{`"a":{"b":"x"}`, `"0":"y"`, `"meta":{"key":"K1"}`}, key: "K1", scope: front},
		{name: "derived key from members a criterion sets",
			policy: `{name: p, match: {methods: [POST], json: [{pointer: /params/name, equals: send}]}, key: {from: [derived], derive: [/params/name, /params/arguments]}, fingerprint: {json: true}}`,
			want:   []string{`"params":{"arguments":"demo","name":"send"}`}, key: "", scope: front},
		{name: "JSON-RPC", policy: `{name: p, match: {path: {exact: /mcp}}, answers: jsonrpc}`,
			want: []string{`"jsonrpc":"2.0"`, `"id":1`, `"method":"tools/call"`}, key: "K1", scope: front},

		{name: "metadata scope", policy: `{name: p, match: {methods: [POST]}, scope: {from: metadata, metadata: {namespace: n, path: [sub]}}}`, why: "scope.from: metadata"},
		{name: "principal scope", policy: `{name: p, match: {methods: [POST]}, scope: {from: principal}}`, why: "scope.from: principal"},
		{name: "another route", policy: `{name: p, match: {route_names: [payments]}}`, why: "match.route_names"},
		{name: "reads only", policy: `{name: p, match: {methods: [GET, HEAD]}}`, why: "match.methods"},
		{name: "path regex", policy: `{name: p, match: {path: {regex: '^/v[0-9]+/x$'}}}`, why: "match.path.regex"},
		{name: "key too long for the policy", policy: `{name: p, match: {methods: [POST]}, key: {max_length: 1}}`, why: "key.max_length"},
		{name: "a pointer through a value",
			policy: `{name: p, match: {methods: [POST], json: [{pointer: /a, equals: x}]}, key: {from: [body], pointer: /a/b}}`, why: "/a/b runs through"},
		{name: "the whole body", policy: `{name: p, match: {methods: [POST], json: [{pointer: "", equals: x}]}}`, why: "the whole body"},
		{name: "a quote in the path", policy: `{name: p, match: {path: {exact: "/it's"}}}`, why: "quote"},
	} {
		t.Run(c.name, func(t *testing.T) {
			set, err := config.Parse("p.yaml", []byte("policies: ["+c.policy+"]\ndefault_policy: {enabled: false}\n"))
			if err != nil {
				t.Fatal(err)
			}
			ex, err := demoExampleFor(set, set.Policies[0], front, "K1")
			if c.why != "" {
				if err == nil || !strings.Contains(err.Error(), c.why) {
					t.Fatalf("got %v, %q; want no example because of %s", err, ex.curl(front), c.why)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			curl := ex.curl(front)
			for _, w := range c.want {
				if !strings.Contains(curl, w) {
					t.Errorf("%s\nlacks %s", curl, w)
				}
			}
			if ex.key != c.key || ex.scope != c.scope {
				t.Errorf("key %q scope %q, want %q %q", ex.key, ex.scope, c.key, c.scope)
			}
			// What TestBinaryDemo's parser reads is what the policy takes.
			req, err := parseCurl(curl)
			if err != nil {
				t.Fatalf("%s: %v", curl, err)
			}
			if got := set.Match(policy.Request{Method: req.Method, Authority: req.Host, Path: req.URL.Path, RouteName: demoWriteRoute}); got != set.Policies[0] {
				t.Errorf("%s is not matched by the policy at its headers", curl)
			}
		})
	}
}

// TestDemoExampleForAnEarlierPolicy: a request an earlier policy takes, at
// its headers or at its body, is no example of a later one; one the
// earlier policy's body criteria refuse is.
func TestDemoExampleForAnEarlierPolicy(t *testing.T) {
	set, err := config.Parse("p.yaml", []byte(`policies:
  - {name: tools, match: {path: {exact: /mcp}, json: [{pointer: /method, equals: tools/call}]}}
  - {name: mcp, match: {path: {exact: /mcp}}, answers: jsonrpc}
  - {name: other-calls, match: {path: {exact: /mcp}, json: [{pointer: /method, equals: other}]}}
  - {name: all-posts, match: {methods: [POST]}}
  - {name: orders, match: {methods: [POST], path: {prefix: /orders}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	// The last is the default policy, after all-posts too.
	for i, want := range []string{"", `taken by policy "tools"`, "", "", `taken by policy "all-posts"`, `taken by policy "all-posts"`} {
		p := set.Policies[i]
		_, err := demoExampleFor(set, p, "127.0.0.1:8080", "K1")
		switch {
		case want == "" && err != nil:
			t.Errorf("policy %q: %v", p.Name, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("policy %q: got %v, want %s", p.Name, err, want)
		}
	}
}

// TestDemoSelf: the printed commands run the binary as README.md's go run
// path does, by name when the shell found it on PATH, else by its absolute
// path.
func TestDemoSelf(t *testing.T) {
	for _, c := range []struct {
		args0, exe string
		checkout   bool
		want       string
	}{
		{"/tmp/go-build123/b001/exe/idem-extproc", "/tmp/go-build123/b001/exe/idem-extproc", true, "go run ./cmd/idem-extproc"},
		{"/home/u/.cache/go-build/b0/b0a1-d/idem-extproc", "/home/u/.cache/go-build/b0/b0a1-d/idem-extproc", true, "go run ./cmd/idem-extproc"},
		// go run from elsewhere than the checkout's root: the build itself.
		{"/tmp/go-build123/b001/exe/idem-extproc", "/tmp/go-build123/b001/exe/idem-extproc", false, "/tmp/go-build123/b001/exe/idem-extproc"},
		{"idem-extproc", "/home/u/go/bin/idem-extproc", true, "idem-extproc"},
		{"./idem-extproc", "/src/idem extproc/idem-extproc", true, "'/src/idem extproc/idem-extproc'"},
	} {
		if got := demoSelf(c.args0, c.exe, c.checkout); got != c.want {
			t.Errorf("demoSelf(%q, %q, %v) = %q, want %q", c.args0, c.exe, c.checkout, got, c.want)
		}
	}
}
