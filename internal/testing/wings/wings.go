// Package wings finds the Go files of the repository's two wings
// (docs/layout.md): the product, which the binary, its client and its
// deployment files are built from, and the test support around it. The
// architecture checks (test/codecheck) and figures (tools/archfigures)
// read the same files through it.
package wings

import (
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
)

// Support are the test-support wing's directories, relative to the
// repository's root.
var Support = []string{"internal/testing/", "test/", "tools/"}

// InSupport reports whether dir, slash-separated and relative to the
// repository's root, is in one of support's directories.
func InSupport(dir string, support []string) bool {
	for _, d := range support {
		if strings.HasPrefix(dir+"/", d) {
			return true
		}
	}
	return false
}

// GoFiles lists the Go files below root, test files and files build
// constraints leave out included, slash-separated and relative to root, as
// the go command would find them in every module (go list itself sees only
// the workspace's modules, not one nested in another).
func GoFiles(root string) ([]string, error) {
	var files []string
	err := fs.WalkDir(os.DirFS(root), ".", func(p string, d fs.DirEntry, err error) error {
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
	return files, err
}

// ProductFiles lists the non-test Go files of GoFiles outside support,
// sorted.
func ProductFiles(root string, support []string) ([]string, error) {
	all, err := GoFiles(root)
	var out []string
	for _, rel := range all {
		if !strings.HasSuffix(rel, "_test.go") && !InSupport(path.Dir(rel), support) {
			out = append(out, rel)
		}
	}
	sort.Strings(out)
	return out, err
}
