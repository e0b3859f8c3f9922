package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// readmeLocalSection is the README section that takes a reader from the
// demo to their own policies on a Redis.
const readmeLocalSection = "\n## Your own policies, locally\n"

// TestBinaryREADMELocalPolicies runs the README's "Your own policies,
// locally": its policy file, its redis-server flags, config check, and the
// server started with the file and the Redis, then holds the file to what
// the section says it does (POST /orders protected, a key required).
func TestBinaryREADMELocalPolicies(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), readmeLocalSection)
	if !ok {
		t.Fatalf("README.md has no section %q", strings.TrimSpace(readmeLocalSection))
	}
	section, _, _ = strings.Cut(section, "\n## ")
	// The section opens with the demo (its own test: TestBinaryDemoOwnSetup);
	// the server's own path is the yaml block and the sh block after it.
	_, policy, ok := strings.Cut(section, "```yaml\n")
	policy, rest, ok2 := strings.Cut(policy, "```")
	_, commands, ok3 := strings.Cut(rest, "```sh\n")
	commands, _, ok4 := strings.Cut(commands, "```")
	if !ok || !ok2 || !ok3 || !ok4 {
		t.Fatal("the section has no yaml block and sh block")
	}
	// The commands, run from the repository's root: redis-server, config
	// check and the server, each as the README writes it, less comments
	// and the shell's &.
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(commands), "\n") {
		l, _, _ = strings.Cut(l, "#")
		lines = append(lines, strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(l), "&")))
	}
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "redis-server ") ||
		lines[1] != "go run ./cmd/idem-extproc config check my-policies.yaml" ||
		!strings.HasPrefix(lines[2], "go run ./cmd/idem-extproc --config my-policies.yaml ") {
		t.Fatalf("the section's commands are not the ones this test runs:\n%s", strings.Join(lines, "\n"))
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "my-policies.yaml")
	writeFile(t, file, policy)
	var redisArgs []string
	for _, a := range strings.Fields(strings.TrimPrefix(lines[0], "redis-server ")) {
		if a == "/tmp" {
			a = dir // --dir: the test's own
		}
		redisArgs = append(redisArgs, a)
	}
	redis := redistest.Start(t, redistest.Options{Args: redisArgs})
	check := exec.Command(binary(t), "config", "check", "my-policies.yaml")
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", lines[1], err, out)
	}
	var flags []string
	for _, f := range strings.Fields(strings.TrimPrefix(lines[2], "go run ./cmd/idem-extproc ")) {
		switch f {
		case "my-policies.yaml":
			f = file
		case "redis://localhost:6379/0":
			f = redis.URL()
		}
		flags = append(flags, f)
	}
	p := start(t, "", "", flags...)
	if strings.Contains(p.stderr.String(), "may lose records") {
		t.Errorf("the section's redis-server flags leave the server warning:\n%s", p.stderr.String())
	}

	env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.OnRedis(redis)})
	if r := env.Post("/orders", "", `{"item":"book"}`); r.Status != 400 || !strings.Contains(r.Body, problem.KeyMissing.Slug) {
		t.Errorf("POST /orders without a key: %d %s, want 400 %s", r.Status, r.Body, problem.KeyMissing.Slug)
	}
	first := env.Post("/orders", "order-1", `{"item":"book"}`)
	again := env.Post("/orders", "order-1", `{"item":"book"}`)
	if first.Err != nil || again.Err != nil || again.Header.Get("Idempotent-Replayed") != "true" || again.Body != first.Body {
		t.Errorf("POST /orders twice with one key: %d %v then %d %v replayed %q", first.Status, first.Err, again.Status, again.Err, again.Header.Get("Idempotent-Replayed"))
	}
	if n := env.Upstream.CountKey("order-1"); n != 1 {
		t.Errorf("the upstream ran order-1 %d times, want once", n)
	}
}
