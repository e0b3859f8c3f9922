package codecheck

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
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

// goFiles lists the repository's Go files, test files and files build
// constraints leave out included, by their path relative to the
// repository's root, as go list would find them in every module (go list
// itself sees only the workspace's modules, not one nested in another);
// root is the repository's root as an absolute path.
func goFiles(t *testing.T) (files []string, root string) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	err = fs.WalkDir(os.DirFS(root), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// As the go command does (go help packages): names that begin with . or
		// _ are ignored, and so are directories named testdata.
		name := d.Name()
		ignored := p != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || d.IsDir() && name == "testdata")
		switch {
		case ignored && d.IsDir():
			return fs.SkipDir
		case !ignored && !d.IsDir() && strings.HasSuffix(name, ".go"):
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, root
}

// productFiles lists every non-test Go file of the product wing, keyed by
// its path relative to the repository's root.
func productFiles(t *testing.T) map[string]string {
	t.Helper()
	all, root := goFiles(t)
	files := map[string]string{}
	for _, rel := range all {
		if !strings.HasSuffix(rel, "_test.go") && !isSupport(module+"/"+path.Dir(rel)) {
			files[rel] = filepath.Join(root, rel)
		}
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
