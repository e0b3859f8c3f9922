package admin

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestCLIHelpAndUsage: asking for help is not an error (exit 0, usage on
// stderr); a missing or unknown subcommand is (exit 2). Neither sends a
// request, so no server is needed.
func TestCLIHelpAndUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-h"}, 0, "usage: idem-extproc admin get|purge|resolve"},
		{[]string{"help"}, 0, "usage: idem-extproc admin get|purge|resolve"},
		{[]string{"get", "-h"}, 0, "-token-file"},
		{[]string{"resolve", "--help"}, 0, "-action"},
		{nil, 2, "usage: idem-extproc admin"},
		{[]string{"resolv"}, 2, `unknown subcommand "resolv"`},
	} {
		var stdout, stderr bytes.Buffer
		code := RunCLI(context.Background(), tc.args, func(string) string { return "" }, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
			t.Errorf("admin %v: exit %d, stderr %q, stdout %q; want exit %d and %q", tc.args, code, stderr.String(), stdout.String(), tc.code, tc.want)
		}
	}
}

// TestCLIUsageMistakesExit2: every mistake in how a record command is
// called exits 2 before any request, saying what is wrong, as the docs
// say; only what the server refuses exits 1. The address is one nothing
// listens on, so a request that went out would exit 1, not 2.
func TestCLIUsageMistakesExit2(t *testing.T) {
	token := t.TempDir() + "/token"
	if err := os.WriteFile(token, []byte("t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	getenv := func(name string) string {
		switch name {
		case "IDEM_ADMIN_TOKEN_FILE":
			return token
		case "IDEM_ADMIN_ADDR":
			return "http://127.0.0.1:1"
		}
		return ""
	}
	const id = "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"get"}, "name the record"},
		{[]string{"purge"}, "name the record"},
		{[]string{"resolve", "--action", "release"}, "name the record"},
		{[]string{"get", "--policy", "default", "--key", "k"}, "missing --scope"},
		{[]string{"get", "--policy", "default", "--scope", "h"}, "missing --key"},
		{[]string{"get", "--scope", "h", "--key", "k"}, "missing --policy"},
		{[]string{"get", "--id", "nothex"}, "--id"},
		{[]string{"get", "--id", id, "--key", "k"}, "not both"},
		{[]string{"purge", "--policy", "default", "--scope", "h", "--key", "a,b"}, "--key"},
		{[]string{"get", "stray"}, "unexpected argument"},
		{[]string{"get", "--nope"}, "flag provided but not defined"},
		{[]string{"adoption", "stray"}, "unexpected argument"},
		{[]string{"resolve", "--id", id}, "--action is required"},
		{[]string{"resolve", "--id", id, "--action", "complete", "--status", "201", "--body-file", "/nonexistent/body"}, "--body-file"},
	} {
		var stdout, stderr bytes.Buffer
		code := RunCLI(context.Background(), tc.args, getenv, &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
			t.Errorf("admin %v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
	// Named well, the request goes out with the names given. An empty
	// --scope is a scope: scope.from: none keeps every key in "".
	var got url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.Query()
		_, _ = w.Write([]byte("{}"))
	}))
	defer srv.Close()
	served := func(name string) string {
		if name == "IDEM_ADMIN_ADDR" {
			return srv.URL
		}
		return getenv(name)
	}
	for _, tc := range []struct {
		args []string
		want url.Values
	}{
		{[]string{"get", "--id", id}, url.Values{"id": {id}}},
		{[]string{"get", "--policy", "default", "--scope", "", "--key", "k"}, url.Values{"policy": {"default"}, "scope": {""}, "key": {"k"}}},
		{[]string{"purge", "--policy", "p", "--scope=api.example.com:8443", "--key", "k"}, url.Values{"policy": {"p"}, "scope": {"api.example.com:8443"}, "key": {"k"}}},
		{[]string{"adoption"}, url.Values{}},
	} {
		got = nil
		var stdout, stderr bytes.Buffer
		if code := RunCLI(context.Background(), tc.args, served, &stdout, &stderr); code != 0 || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("admin %v: exit %d, stderr %q, query %v; want exit 0 and query %v", tc.args, code, stderr.String(), got, tc.want)
		}
	}
}

// TestCLIScopeHelpNamesThePort: the scope of the default policy is the
// request's :authority verbatim, port included (extproc's scopeOf), so the
// help that tells an operator what to pass says so; a host without its
// port names another record (cmd/idem-extproc TestBinaryAdminCLI).
func TestCLIScopeHelpNamesThePort(t *testing.T) {
	for _, cmd := range []string{"get", "purge", "resolve"} {
		usage := Flags(cmd, func(string) string { return "" }).Lookup("scope").Usage
		if !strings.Contains(usage, ":authority") || !strings.Contains(usage, "port included") {
			t.Errorf("admin %s --scope: %q does not say the scope is the :authority with its port", cmd, usage)
		}
	}
}
