package codecheck

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/wings"
)

// The repository has two wings (docs/layout.md): the product (everything the
// binary, its client and its deployment files are built from) and the test
// support around it (environments under internal/testing, test-only
// packages under test, tools under tools). Product code must not depend on
// test support: a helper written for tests, with a test's shortcuts, would
// otherwise end up in the server.
const module = "github.com/idem-extproc/idem-extproc"

// isSupport reports whether the import path is a package of the
// test-support wing.
func isSupport(importPath string) bool {
	rel, ok := strings.CutPrefix(importPath, module+"/")
	return ok && wings.InSupport(rel, wings.Support)
}

// allowedSupportImports is the one exception, file by file: the demo command
// ships the Envoy-like front of envoysim on purpose, so that `idem-extproc
// demo` shows the server's answers without an Envoy binary (README.md, "Try
// it"). No other product file may import a test-support package.
var allowedSupportImports = map[string][]string{
	"cmd/idem-extproc/demo.go": {module + "/internal/testing/envoysim"},
}

// goFiles lists the repository's Go files (wings.GoFiles); root is the
// repository's root as an absolute path.
func goFiles(t *testing.T) (files []string, root string) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if files, err = wings.GoFiles(root); err != nil {
		t.Fatal(err)
	}
	return files, root
}

// productFiles lists every non-test Go file of the product wing, keyed by
// its path relative to the repository's root.
func productFiles(t *testing.T) map[string]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	rels, err := wings.ProductFiles(root, wings.Support)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, rel := range rels {
		files[rel] = filepath.Join(root, rel)
	}
	if len(files) == 0 {
		t.Fatal("found no product file")
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
