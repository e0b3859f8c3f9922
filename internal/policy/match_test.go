package policy

import (
	"regexp"
	"testing"
)

func TestMatch(t *testing.T) {
	post := Request{Method: "POST", Authority: "api.example.com:8443", Path: "/v1/orders/42?expand=items", RouteName: "orders"}
	for _, tc := range []struct {
		name  string
		match Match
		req   Request
		want  bool
	}{
		{"empty match takes everything", Match{}, post, true},
		{"method", Match{Methods: []string{"PATCH", "POST"}}, post, true},
		{"method case-insensitive", Match{Methods: []string{"post"}}, post, true},
		{"other method", Match{Methods: []string{"PUT"}}, post, false},
		{"route name", Match{RouteNames: []string{"orders"}}, post, true},
		{"other route name", Match{RouteNames: []string{"payments"}}, post, false},
		{"route name absent", Match{RouteNames: []string{"orders"}}, Request{Method: "POST"}, false},
		{"exact host ignores the port", Match{Hosts: []string{"api.example.com"}}, post, true},
		{"host with port", Match{Hosts: []string{"api.example.com:8443"}}, post, true},
		{"host with other port", Match{Hosts: []string{"api.example.com:443"}}, post, false},
		{"wildcard host", Match{Hosts: []string{"*.example.com"}}, post, true},
		{"wildcard needs a label", Match{Hosts: []string{"*.example.com"}}, Request{Authority: "example.com"}, false},
		{"wildcard suffix only", Match{Hosts: []string{"*.example.com"}}, Request{Authority: "api.example.com.evil"}, false},
		{"host case-insensitive", Match{Hosts: []string{"api.example.com"}}, Request{Authority: "API.Example.com"}, true},
		{"path exact ignores the query", Match{PathExact: "/v1/orders/42"}, post, true},
		{"path exact", Match{PathExact: "/v1/orders"}, post, false},
		{"path prefix", Match{PathPrefix: "/v1/"}, post, true},
		{"path prefix miss", Match{PathPrefix: "/v2/"}, post, false},
		{"path regex", Match{PathRegex: regexp.MustCompile(`^/v1/orders/[0-9]+$`)}, post, true},
		{"path regex does not see the query", Match{PathRegex: regexp.MustCompile(`expand`)}, post, false},
		{"all criteria", Match{Methods: []string{"POST"}, Hosts: []string{"*.example.com"}, RouteNames: []string{"orders"}, PathPrefix: "/v1"}, post, true},
		{"one criterion fails", Match{Methods: []string{"POST"}, Hosts: []string{"other.com"}}, post, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.match.Matches(tc.req); got != tc.want {
				t.Fatalf("Matches = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSetFirstMatchWins(t *testing.T) {
	a := &Policy{Name: "a", Match: Match{PathPrefix: "/a"}}
	b := &Policy{Name: "b", Match: Match{Methods: []string{"POST"}}}
	set := &Set{Policies: []*Policy{a, b}}
	if p := set.Match(Request{Method: "POST", Path: "/a/1"}); p != a {
		t.Fatalf("got %v, want a", p)
	}
	if p := set.Match(Request{Method: "POST", Path: "/b"}); p != b {
		t.Fatalf("got %v, want b", p)
	}
	if p := set.Match(Request{Method: "GET", Path: "/b"}); p != nil {
		t.Fatalf("got %v, want none", p)
	}
}

func TestStoresHeader(t *testing.T) {
	p := Default()
	p.StoredHeaderDeny = []string{"set-cookie"}
	for name, want := range map[string]bool{
		"content-type": true, "location": true, "x-custom": true,
		"connection": false, "transfer-encoding": false, "content-length": false, "date": false,
		"keep-alive": false, "te": false, "trailer": false, "upgrade": false, "proxy-authenticate": false,
		"x-envoy-upstream-service-time": false, ":status": false, "set-cookie": false,
	} {
		if got := p.StoresHeader(name); got != want {
			t.Errorf("StoresHeader(%q) = %v, want %v", name, got, want)
		}
	}
}
