package main

import (
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/testing/ports"
)

// runBinary runs the built binary with args and env added to the test's
// environment, and returns its stdout, stderr and exit code.
func runBinary(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// TestBinaryVersion: the version stamped with -ldflags -X is what
// `version`, `--version` and the build_info metric report.
func TestBinaryVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, errOut, code := runBinary(t, nil, args...)
		if code != 0 || !strings.HasPrefix(out, "idem-extproc "+testVersion+" (") || errOut != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	p := start(t, "", "")
	resp, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `idem_extproc_build_info{goversion="go`) || !strings.Contains(string(body), `version="`+testVersion+`"`) {
		t.Fatalf("build_info does not carry %s:\n%s", testVersion, grepLines(string(body), "build_info"))
	}
}

func grepLines(s, sub string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// TestBinaryHelp: --help reads like the field's tools: a one-line
// description, every subcommand, every server flag spelt --flag, and every
// IDEM_* variable; it exits 0 and writes to stdout.
func TestBinaryHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		out, _, code := runBinary(t, nil, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d", args, code)
		}
		if first := strings.SplitN(out, "\n", 2)[0]; first != description {
			t.Errorf("%v: first line %q, want the description", args, first)
		}
		for _, sub := range []string{"serve", "admin", "config", "probe", "demo", "version", "completion"} {
			if !strings.Contains(out, "\n  "+sub+" ") {
				t.Errorf("%v: help does not list the %s subcommand", args, sub)
			}
		}
		n := 0
		daemon.Flags().VisitAll(func(f *flag.Flag) {
			n++
			if !strings.Contains(out, "  --"+f.Name+" ") {
				t.Errorf("%v: help does not show --%s", args, f.Name)
			}
			if !strings.Contains(out, daemon.EnvName(f.Name)) {
				t.Errorf("%v: help does not list %s", args, daemon.EnvName(f.Name))
			}
		})
		if n < 10 {
			t.Fatalf("only %d server flags", n)
		}
		if strings.Contains(out, "\n  -listen") {
			t.Errorf("%v: help spells a flag with one dash:\n%s", args, out)
		}
	}
	out, _, code := runBinary(t, nil, "admin", "resolve", "--help")
	if code != 0 || !strings.Contains(out, "--action string") || !strings.Contains(out, "--token-file string") {
		t.Errorf("admin resolve --help: exit %d\n%s", code, out)
	}
}

// TestBinaryUsageErrors: a misspelt subcommand or flag exits 2 with one
// line naming it (and a suggestion), not a server start or a page of usage.
func TestBinaryUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sevre"}, `unknown command "sevre"`},
		{[]string{"admin", "resolv"}, "did you mean resolve?"},
		{[]string{"admin"}, "idem-extproc admin [command]"},
		{[]string{"admin", "--nope"}, "idem-extproc admin [command]"},
		{[]string{"--nope"}, "flag provided but not defined: --nope"},
		{[]string{"admin", "get", "--nope"}, "flag provided but not defined: --nope"},
		{[]string{"config", "check"}, "accepts 1 arg(s), received 0"},
		{[]string{"probe", "--http", "a:1", "--grpc", "b:2"}, "not both"},
	} {
		_, errOut, code := runBinary(t, nil, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestBinaryConfigCheck: `config check` accepts the shipped example and
// prints its effective policies (defaults filled in) as a policy file; an
// invalid file exits 1 with the server's file:line messages.
func TestBinaryConfigCheck(t *testing.T) {
	out, _, code := runBinary(t, nil, "config", "check", "../../examples/policies.yaml")
	if code != 0 {
		t.Fatalf("config check of the example: exit %d\n%s", code, out)
	}
	type rule struct{ Status, Origin, Action string }
	var doc struct {
		Policies []struct {
			Name, Retention, Lease string
			Key                    struct{ Required bool }
			Responses              []rule
			Durability             string
			DurabilityTimeout      string `yaml:"durability_timeout"`
		}
		DefaultPolicy struct{ Enabled bool } `yaml:"default_policy"`
	}
	if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("output is not YAML: %v\n%s", err, out)
	}
	if len(doc.Policies) < 2 || doc.Policies[0].Name != "payments" || !doc.DefaultPolicy.Enabled {
		t.Fatalf("policies not in match order, the default policy apart:\n%s", out)
	}
	pay := doc.Policies[0]
	// From the example: retention 72h, a required key, its own response
	// rule; from the built-in defaults: the 30s lease and the replicas'
	// 50ms wait.
	if pay.Retention != "72h" || !pay.Key.Required || pay.Lease != "30s" ||
		len(pay.Responses) != 1 || pay.Responses[0] != (rule{Status: "5xx", Origin: "upstream", Action: "unknown"}) ||
		pay.Durability != "replicated" || pay.DurabilityTimeout != "50ms" {
		t.Fatalf("payments policy: %+v\n%s", pay, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, bad, "policies:\n  - name: x\n    match: {methods: [POST]}\n    retention: 1h\n    lease: 2h\n")
	stdout, errOut, code := runBinary(t, nil, "config", "check", bad)
	if code != 1 || stdout != "" || !strings.Contains(errOut, "bad.yaml:5: policies[0].lease") {
		t.Fatalf("invalid file: exit %d, stdout %q, stderr %q", code, stdout, errOut)
	}
}

// threeMistakes is a policy file with three unrelated mistakes: an unknown
// field in one policy, a bad duration in another, an unknown field in
// default_policy. internal/config's TestEveryMistakeInOneLoad loads it too.
var threeMistakes = func() string {
	b, err := os.ReadFile("../../internal/config/testdata/three-mistakes.yaml")
	if err != nil {
		panic(err) // a fixture of the repository
	}
	return string(b)
}()

// threeMistakesReport is what a load of threeMistakes at path reports, one
// line per mistake in file order (each line's start).
func threeMistakesReport(path string) []string {
	return []string{
		path + ":5: policies[0].match.path.pathprefix: unknown field; did you mean prefix?",
		path + `:8: policies[1].retention: "2 days" is not a duration`,
		path + ":11: default_policy.retentoin: unknown field; did you mean retention?",
	}
}

// TestBinaryConfigCheckReportsEveryMistake: `config check` on a file with
// several mistakes names them all in one run, one line each on stderr, and
// exits 1 with nothing on stdout.
func TestBinaryConfigCheckReportsEveryMistake(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, bad, threeMistakes)
	stdout, errOut, code := runBinary(t, nil, "config", "check", bad)
	if code != 1 || stdout != "" {
		t.Fatalf("exit %d, stdout %q; want 1 and nothing", code, stdout)
	}
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	want := threeMistakesReport(bad)
	if len(lines) != len(want) {
		t.Errorf("%d lines on stderr, want one per mistake (%d):\n%s", len(lines), len(want), errOut)
	}
	for i, w := range want {
		if i >= len(lines) || !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: want it to start with\n\t%s\nstderr:\n%s", i+1, w, errOut)
		}
	}
}

// TestBinaryProbe: `probe` exits 0 against a ready server, over /readyz
// (the port taken from IDEM_ADMIN_LISTEN by default) and over gRPC health,
// and 1 when nothing answers.
func TestBinaryProbe(t *testing.T) {
	p := start(t, "", "")
	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{[]string{"IDEM_ADMIN_LISTEN=:" + port(p.admin)}, []string{"probe"}},
		{nil, []string{"probe", "--http", p.admin}},
		{nil, []string{"probe", "--grpc", p.listen}},
		{nil, []string{"probe", "--grpc", p.listen, "--grpc-service", "envoy.service.ext_proc.v3.ExternalProcessor"}},
	} {
		out, errOut, code := runBinary(t, tc.env, tc.args...)
		if code != 0 || !strings.HasPrefix(out, "ready") {
			t.Errorf("%v %v: exit %d, stdout %q, stderr %q", tc.env, tc.args, code, out, errOut)
		}
	}
	dead := ports.Hold(t)
	for _, args := range [][]string{{"probe", "--http", dead}, {"probe", "--grpc", dead, "--timeout", "300ms"}} {
		if _, errOut, code := runBinary(t, nil, args...); code != 1 || !strings.Contains(errOut, dead) {
			t.Errorf("%v: exit %d, stderr %q; want 1", args, code, errOut)
		}
	}
}

func port(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

// TestBinaryCompletion: cobra's completion scripts are there, and the
// server's bridged flags complete.
func TestBinaryCompletion(t *testing.T) {
	out, _, code := runBinary(t, nil, "completion", "bash")
	if code != 0 || !strings.Contains(out, "__start_idem-extproc") {
		t.Fatalf("completion bash: exit %d\n%.300s", code, out)
	}
	out, _, code = runBinary(t, nil, "__complete", "--redis-")
	if code != 0 || !strings.Contains(out, "--redis-url") {
		t.Fatalf("flag completion: exit %d\n%s", code, out)
	}
}

// TestBinaryAdminAdoption: `admin adoption` prints the server's adoption
// report (before this CLI it had no subcommand; only curl reached it).
func TestBinaryAdminAdoption(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, "cli-token\n")
	p := start(t, "", "", "--admin-token-file", tokenFile)
	env := []string{"IDEM_ADMIN_ADDR=http://" + p.admin, "IDEM_ADMIN_TOKEN_FILE=" + tokenFile}
	out, errOut, code := runBinary(t, env, "admin", "adoption")
	var report struct {
		Policies []struct {
			Policy string `json:"policy"`
		} `json:"policies"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &report) != nil || len(report.Policies) != 1 || report.Policies[0].Policy != "default" {
		t.Fatalf("admin adoption: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, errOut, code := runBinary(t, env, "admin", "adoption", "--key", "x"); code != 2 || !strings.Contains(errOut, "--key") {
		t.Fatalf("adoption takes no record flags: exit %d, stderr %q", code, errOut)
	}
}

// TestImageRunsTheProbeAndTheStamp runs the health checks of the Dockerfile
// and docker-compose.yml with this binary in the image's place, against a
// ready server (exit 0) and against none (exit 1), with the environment
// the container has; and checks the Dockerfile stamps the variable these
// tests stamp. test/deploytest checks the files' form; this, that what
// they run works.
func TestImageRunsTheProbeAndTheStamp(t *testing.T) {
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), "-X "+versionVar+"=${VERSION}") {
		t.Errorf("the Dockerfile does not stamp %s", versionVar)
	}
	var hc []string
	for _, line := range strings.Split(string(dockerfile), "\n") {
		if rest, ok := strings.CutPrefix(line, "HEALTHCHECK "); ok {
			_, cmd, _ := strings.Cut(rest, "CMD ")
			if err := json.Unmarshal([]byte(cmd), &hc); err != nil {
				t.Fatalf("HEALTHCHECK %q: %v", rest, err)
			}
		}
	}
	composeFile, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(composeFile, &compose); err != nil {
		t.Fatal(err)
	}
	checks := map[string][]string{"Dockerfile HEALTHCHECK": hc}
	if test := compose.Services["idem-extproc"].Healthcheck.Test; len(test) > 1 && test[0] == "CMD" {
		checks["compose healthcheck"] = test[1:]
	}
	p := start(t, "", "")
	for name, argv := range checks {
		if len(argv) < 2 || argv[0] != "/usr/local/bin/idem-extproc" {
			t.Fatalf("%s runs %q, not the image's binary", name, argv)
		}
		env := []string{"IDEM_ADMIN_LISTEN=:" + port(p.admin)} // the container's own environment sets it, or 8081
		if out, errOut, code := runBinary(t, env, argv[1:]...); code != 0 {
			t.Errorf("%s against a ready server: exit %d\n%s%s", name, code, out, errOut)
		}
		if _, _, code := runBinary(t, []string{"IDEM_ADMIN_LISTEN=:" + port(ports.Hold(t))}, argv[1:]...); code != 1 {
			t.Errorf("%s with no server: exit %d, want 1", name, code)
		}
	}
	if len(checks) != 2 {
		t.Fatalf("found %d health checks, want the Dockerfile's and compose's", len(checks))
	}
}
