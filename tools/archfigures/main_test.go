package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/wings"
)

// TestStaticFigures counts a small tree whose every figure is known.
func TestStaticFigures(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("internal/extproc/stream.go", `package extproc

import extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

type processor struct{}

func (s *Server) serve(st stream) {
	for {
		req, _ := st.Recv()
		st.Send(nil)
		_ = req
	}
}

func (p *processor) a(req *extprocv3.ProcessingRequest) {}
func (p *processor) b()                                  { p.send(nil) }
func helper(req *extprocv3.ProcessingRequest)            {}
`)
	write("internal/other/long.go", "package other\n\nfunc long() {\n"+strings.Repeat("\t_ = 1\n", 80)+"}\n")
	write("internal/other/imports.go", "package other\n\nimport _ \""+module+"/internal/testing/envoysim\"\n")
	write("internal/testing/envoysim/sim.go", "package envoysim\n\nfunc notCounted() {\n"+strings.Repeat("\t_ = 1\n", 90)+"}\n")
	files, err := wings.ProductFiles(root, supportDirs)
	if err != nil {
		t.Fatal(err)
	}
	st, err := static(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		got  []string
		want int
	}{
		{"processor methods", st.processorMethods, 2},
		{"whole-message signatures", st.wholeMessage, 2},
		{"sends outside the loop", st.sendsOutsideLoop, 1},
		{"long functions", st.longFuncs, 1},
		{"long files", st.longFiles, 0},
		{"test-support imports", st.supportImports, 1},
	} {
		if len(c.got) != c.want {
			t.Errorf("%s: %v, want %d", c.what, c.got, c.want)
		}
	}
	if st.loopFile != "internal/extproc/stream.go" || st.loopFunc != "Server.serve" {
		t.Errorf("stream loop %s %s", st.loopFile, st.loopFunc)
	}
}

// TestExceeded: a figure past its limit fails the run, one at it does not.
func TestExceeded(t *testing.T) {
	var ex exceeded
	if got := ex.limit("at", 15, 15); got != "(at most 15)" || ex.err() != nil {
		t.Fatalf("a figure at its limit: %q, %v", got, ex.err())
	}
	if got := ex.limit("none", 0, 0); got != "(0)" || ex.err() != nil {
		t.Fatalf("a figure of 0 at 0: %q, %v", got, ex.err())
	}
	ex.limit("past", 16, 15)
	if err := ex.err(); err == nil || !strings.Contains(err.Error(), "past: 16, at most 15") {
		t.Fatalf("a figure past its limit: %v", err)
	}
}

// TestRepositoryWithinLimits counts this repository's figures, the walk
// as run included, so that a figure past its limit fails the suite and
// not only a run of the tool.
func TestRepositoryWithinLimits(t *testing.T) {
	if err := run(filepath.Join("..", ".."), defaultScope, defaultFollow, false, true); err != nil {
		t.Fatal(err)
	}
}
