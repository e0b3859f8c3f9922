package codecheck

import (
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The two maps of the code a reader is pointed to: docs/layout.md, a row
// per package of either wing, and docs/design.md §11, the product's files
// by what they keep. A map that misses a package or a file, or names one
// that is gone, sends its reader to the wrong place; these tests fail
// then, so that the maps are mended with the code that moved.

// TestLayoutMapsEveryPackage: every package of the repository, in any of
// its modules, has a row in docs/layout.md that names its directory in its
// first column, in the table of its wing; and every path a first column
// names exists.
func TestLayoutMapsEveryPackage(t *testing.T) {
	t.Parallel()
	files, root := goFiles(t)
	product, support, ok := strings.Cut(readDoc(t, root, "docs/layout.md"), "\n## Test support\n")
	if !ok {
		t.Fatal("docs/layout.md has no \"Test support\" section")
	}
	inSupport := map[string]bool{} // by path named: whether the test-support table names it
	for i, wing := range []string{product, support} {
		for _, row := range tableRows(t, wing) {
			for _, tok := range backticked(row[0]) {
				p := strings.TrimSuffix(tok, "/")
				inSupport[p] = i == 1
				if _, err := os.Stat(filepath.Join(root, p)); err != nil {
					t.Errorf("docs/layout.md names %s, which does not exist", tok)
				}
			}
		}
	}
	dirs := map[string]bool{}
	for _, f := range files {
		dirs[path.Dir(f)] = true
	}
	for _, rel := range slices.Sorted(maps.Keys(dirs)) {
		switch named, ok := inSupport[rel]; {
		case !ok:
			t.Errorf("package %s has no row in docs/layout.md", rel)
		case named != isSupport(module+"/"+rel):
			t.Errorf("docs/layout.md lists package %s in the other wing's table", rel)
		}
	}
}

// TestDesignMapsEveryProductFile: every product Go file (outside its
// tests) is named in the file column of docs/design.md §11, and every path
// that column names exists. In a cell, a file named without a directory,
// or by a path under a directory that is not the repository's (scripts/),
// is in the directory of the path named before it (or in the directory
// named before it).
func TestDesignMapsEveryProductFile(t *testing.T) {
	t.Parallel()
	files := productFiles(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	doc := readDoc(t, root, "docs/design.md")
	start := strings.Index(doc, "\n## §11 ")
	if start < 0 {
		t.Fatal("docs/design.md has no §11")
	}
	section := doc[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	named := map[string]bool{}
	for _, row := range tableRows(t, section) {
		if len(row) < 2 {
			continue
		}
		dir := ""
		for _, tok := range backticked(row[1]) {
			if !strings.Contains(tok, "/") && !fileExts[path.Ext(tok)] {
				continue // a name in the code, such as policy.Set.CheckStore
			}
			p := tok
			if first, _, _ := strings.Cut(tok, "/"); !isDir(filepath.Join(root, first)) {
				p = path.Join(dir, tok)
			}
			if dir = p; fileExts[path.Ext(p)] {
				dir = path.Dir(p)
			}
			matches, err := filepath.Glob(filepath.Join(root, p))
			if err != nil || len(matches) == 0 {
				t.Errorf("docs/design.md §11 names %s (%s), which does not exist", tok, p)
			}
			named[p] = true
		}
	}
	var missing []string
	for rel := range files {
		if !named[rel] {
			missing = append(missing, rel)
		}
	}
	sort.Strings(missing)
	for _, rel := range missing {
		t.Errorf("%s is not in docs/design.md §11", rel)
	}
}

// fileExts are the extensions of the files §11 names.
var fileExts = map[string]bool{".go": true, ".lua": true, ".md": true, ".yaml": true}

func readDoc(t *testing.T, root, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// tableRows are the cells of the body rows of every Markdown table in doc
// (not its header rows, nor the rows of dashes under them).
func tableRows(t *testing.T, doc string) [][]string {
	t.Helper()
	var rows [][]string
	header := true
	for line := range strings.Lines(doc) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			header = true
			continue
		}
		if header {
			header = false // the header row; the dashes follow
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if strings.Trim(cells[0], " -") == "" {
			continue
		}
		rows = append(rows, cells)
	}
	if len(rows) == 0 {
		t.Fatal("no table rows")
	}
	return rows
}

var backtick = regexp.MustCompile("`([^`]+)`")

// backticked are the spans in backticks of a cell.
func backticked(cell string) []string {
	var out []string
	for _, m := range backtick.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}
