// Package codecheck runs the static analysers over the whole module as
// part of the test suite, so CI cannot pass with a finding: go vet,
// staticcheck (honnef.co/go/tools, pinned in go.mod as a tool), and
// go mod verify.
package codecheck

import (
	"os/exec"
	"testing"
)

func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go command must be in PATH to run the analysers")
	}
	return p
}

func run(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(goTool(t), args...)
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %v: %v\n%s", args, err, out)
	}
}

func TestGoVet(t *testing.T) {
	t.Parallel()
	run(t, "vet", "./...")
}

func TestStaticcheck(t *testing.T) {
	t.Parallel()
	run(t, "tool", "staticcheck", "./...")
}

// TestModulesVerify: every dependency in the module cache is the one
// go.sum pins, byte for byte (SECURITY.md: dependencies are pinned and
// checked).
func TestModulesVerify(t *testing.T) {
	t.Parallel()
	run(t, "mod", "verify")
}
