// Package codecheck runs, as part of the test suite, the checks beyond go
// vet (which README.md's command runs first, over both modules), so CI
// cannot pass with a finding: staticcheck (honnef.co/go/tools, pinned in
// go.mod as a tool) over the server's module, go mod verify, and the
// project's own rules on its files and docs.
package codecheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/norace"
)

func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go command must be in PATH to run the analysers")
	}
	return p
}

// run runs the go command with args at the repository's root.
func run(t *testing.T, args ...string) {
	t.Helper()
	check(t, exec.Command(goTool(t), args...))
}

// check runs cmd at the repository's root and fails t with its output.
func check(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
}

// TestStaticcheck builds staticcheck itself without the race detector (it
// is a program the suite runs, not a part of it), with -trimpath and under
// norace.Lock as the suite's one test built without the detector is, so
// that the two compile the standard library once between them. It then
// points staticcheck's package loader (go list, which reads GOFLAGS) at
// the builds README.md's command makes (the race detector, -trimpath, the
// release tag), so that it reuses those compilations instead of compiling
// every package once more. It reads the server's module, not the deploy
// tests' (test code, which go vet reads): there, computing its facts for
// Kubernetes, Helm, Istio and the rest cost 141 of its 184 CPU-seconds
// with nothing cached.
func TestStaticcheck(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "staticcheck")
	unlock := norace.Lock(t)
	run(t, "build", "-trimpath", "-o", bin, "honnef.co/go/tools/cmd/staticcheck")
	unlock()
	cmd := exec.Command(bin, "./...")
	cmd.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -race -trimpath -tags=grpcnotrace"))
	check(t, cmd)
}

// TestModulesVerify: every dependency in the module cache is the one
// go.sum pins, byte for byte (SECURITY.md: dependencies are pinned and
// checked).
func TestModulesVerify(t *testing.T) {
	t.Parallel()
	run(t, "mod", "verify")
}

// heavyTestOnly are the module paths only the deploy tests use: they live in
// test/deploytest's own module, so that the server's go.mod (what
// vulnerability scanners read) lists only what the binary and its tests use.
var heavyTestOnly = []string{
	"k8s.io/", "sigs.k8s.io/kustomize", "sigs.k8s.io/controller-runtime", "sigs.k8s.io/gateway-api",
	"helm.sh/", "istio.io/", "github.com/envoyproxy/gateway", "github.com/prometheus/prometheus",
}

func TestServerModuleIsLean(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(fields) == 0 {
			continue
		}
		for _, p := range heavyTestOnly {
			if strings.HasPrefix(fields[0], p) {
				t.Errorf("go.mod:%d requires %s: a deploy-test dependency belongs in test/deploytest/go.mod", i+1, fields[0])
			}
		}
	}
}

// TestCIRunsTheREADMECommand: .ci/run runs the very test command README.md
// gives a newcomer, so what CI proves is what the README promises.
func TestCIRunsTheREADMECommand(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	var command string
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "go ") && strings.Contains(line, "go test ") {
			command = line
			break
		}
	}
	if command == "" {
		t.Fatal("README.md has no go command line that runs go test")
	}
	if !strings.Contains(string(ci), "{ "+command+"; }") {
		t.Errorf(".ci/run does not run README.md's test command %q", command)
	}
}
