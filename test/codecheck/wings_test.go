package codecheck

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The repository has two wings (docs/layout.md): the product (everything the
// binary, its client and its deployment files are built from) and the test
// support around it (environments under internal/testing, test-only
// packages under test, tools under tools). Product code must not depend on
// test support: a helper written for tests, with a test's shortcuts, would
// otherwise end up in the server.
const module = "github.com/idem-extproc/idem-extproc"

// supportPrefixes are the import-path prefixes of the test-support wing.
var supportPrefixes = []string{
	module + "/internal/testing/",
	module + "/test/",
	module + "/tools/",
}

func isSupport(path string) bool {
	for _, p := range supportPrefixes {
		if strings.HasPrefix(path+"/", p) {
			return true
		}
	}
	return false
}

// allowedSupportImports is the one exception, file by file: the demo command
// ships the Envoy-like front of envoysim on purpose, so that `idem-extproc
// demo` shows the server's answers without an Envoy binary (README.md, "Try
// it"). No other product file may import a test-support package.
var allowedSupportImports = map[string][]string{
	"cmd/idem-extproc/demo.go": {module + "/internal/testing/envoysim"},
}

type listedPackage struct {
	ImportPath     string
	Dir            string
	GoFiles        []string
	CgoFiles       []string
	IgnoredGoFiles []string
}

// listPackages lists the root module's packages (go list ./...), and
// gives the repository's root as an absolute path.
func listPackages(t *testing.T) ([]listedPackage, string) {
	t.Helper()
	cmd := exec.Command(goTool(t), "list", "-e", "-json=ImportPath,Dir,GoFiles,CgoFiles,IgnoredGoFiles", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding go list's output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, root
}

// productFiles lists every non-test Go file of the root module's product
// packages, including files another platform's build constraints would
// select, keyed by their path relative to the repository's root.
func productFiles(t *testing.T) map[string]string {
	t.Helper()
	pkgs, root := listPackages(t)
	files := map[string]string{}
	for _, p := range pkgs {
		if isSupport(p.ImportPath) {
			continue
		}
		for _, names := range [][]string{p.GoFiles, p.CgoFiles, p.IgnoredGoFiles} {
			for _, name := range names {
				if strings.HasSuffix(name, "_test.go") || !strings.HasSuffix(name, ".go") {
					continue
				}
				abs := filepath.Join(p.Dir, name)
				rel, err := filepath.Rel(root, abs)
				if err != nil {
					t.Fatal(err)
				}
				files[filepath.ToSlash(rel)] = abs
			}
		}
	}
	if len(files) == 0 {
		t.Fatal("go list found no product file")
	}
	return files
}

// TestProductDoesNotImportTestSupport reads the imports of every product
// file and fails on any test-support package outside the allowlist, and on
// an allowlist entry no file uses any more (an exception nobody needs must
// not stay open).
func TestProductDoesNotImportTestSupport(t *testing.T) {
	t.Parallel()
	used := map[string]bool{}
	files := productFiles(t)
	names := make([]string, 0, len(files))
	for rel := range files {
		names = append(names, rel)
	}
	sort.Strings(names)
	fset := token.NewFileSet()
	for _, rel := range names {
		f, err := parser.ParseFile(fset, files[rel], nil, parser.ImportsOnly)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatalf("%s: import %s: %v", rel, imp.Path.Value, err)
			}
			if !isSupport(path) {
				continue
			}
			allowed := false
			for _, a := range allowedSupportImports[rel] {
				if a == path {
					allowed = true
					used[rel+" "+path] = true
				}
			}
			if !allowed {
				t.Errorf("%s imports %s: product code must not depend on the test-support wing (docs/layout.md)", rel, path)
			}
		}
	}
	for rel, paths := range allowedSupportImports {
		for _, p := range paths {
			if !used[rel+" "+p] {
				t.Errorf("allowedSupportImports lets %s import %s, which it no longer does: remove the exception", rel, p)
			}
		}
	}
}
