// Command archfigures recounts the figures by which the repository's
// architecture is judged (docs/layout.md, "Architecture figures"):
//
//   - the walk: following one stream's value from the ext_proc stream loop
//     through one protected first write and then its replay, how many
//     files a reader enters, how many times, and how many of those entries
//     come back to a file already left;
//   - the processor's methods, the signatures that take the whole
//     ProcessingRequest, and the calls that send on the stream outside the
//     stream loop;
//   - product functions over 80 lines and product files over 500 lines;
//   - product files that import the test-support wing.
//
// Run it from the repository's root (or name one with -root):
//
//	go run ./tools/archfigures
//	go run ./tools/archfigures -root /path/to/checkout -v
//
// The static figures are read from the source with go/parser. The walk is
// measured, not guessed: the tool copies the root module's internal tree to
// a temporary directory, adds a recorder call at the top of every function
// and function literal of the product packages, and runs, as a test in that
// copy, the messages Envoy sends for one protected POST (request headers and
// body, response headers and body, BUFFERED bodies, as envoysim sends them)
// and then for its retry (request headers and body, answered from the record)
// through extproc.Server.Process, with the in-memory store. Only the stream's
// own goroutine is followed (the lease renewer's is not). A call counts as
// entering a file when the function called is in another file than the
// function it was called from; -scope says whose functions the reader
// follows (by default those of the packages that hold the per-stream value,
// internal/extproc and internal/attempt; calls into other packages are read
// as leaves), and -scope product follows every product package.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/idem-extproc/idem-extproc/internal/testing/wings"
)

const module = "github.com/idem-extproc/idem-extproc"

// supportDirs are the test-support wing (docs/layout.md); -support
// replaces them, to count a checkout from before the wings had their paths.
var supportDirs = wings.Support

// The walk's limits hold for the default walk only: a wider scope, or
// every call followed, enters more files by design.
const defaultScope, defaultFollow = "internal/extproc,internal/attempt", "value"

func main() {
	root := flag.String("root", ".", "the repository's root")
	scope := flag.String("scope", defaultScope,
		`the packages whose functions the walk follows, comma-separated directories, or "product"`)
	follow := flag.String("follow", defaultFollow,
		`which calls the walk follows: "value", into functions that receive the per-stream value (a processor or an attempt); "all", into every function`)
	verbose := flag.Bool("v", false, "list each item behind a figure, and the walk's entries")
	noWalk := flag.Bool("nowalk", false, "count the static figures only")
	support := flag.String("support", strings.Join(supportDirs, ","), "the test-support wing's directories, comma-separated")
	flag.Parse()
	supportDirs = strings.Split(*support, ",")
	if *follow != "value" && *follow != "all" {
		fmt.Fprintln(os.Stderr, "archfigures: -follow is value or all")
		os.Exit(2)
	}
	if err := run(*root, *scope, *follow, *verbose, !*noWalk); err != nil {
		fmt.Fprintln(os.Stderr, "archfigures:", err)
		os.Exit(1)
	}
}

func run(root, scope, follow string, verbose, walk bool) error {
	files, err := wings.ProductFiles(root, supportDirs)
	if err != nil {
		return err
	}
	st, err := static(root, files)
	if err != nil {
		return err
	}
	var ex exceeded
	st.print(verbose, &ex)
	if !walk {
		return ex.err()
	}
	w, err := measureWalk(root, files, st.loopFile, st.loopFunc, scope, follow)
	if err != nil {
		return fmt.Errorf("measuring the walk: %w", err)
	}
	w.print(verbose, &ex)
	return ex.err()
}

// exceeded lists the figures past their limits (the "at most" column):
// any fails the run.
type exceeded []string

// limit is the column's text for a figure of n, at most max, and notes n
// when it is past it.
func (e *exceeded) limit(title string, n, max int) string {
	if n > max {
		*e = append(*e, fmt.Sprintf("%s: %d, at most %d", strings.TrimSpace(title), n, max))
	}
	if max == 0 {
		return "(0)"
	}
	return fmt.Sprintf("(at most %d)", max)
}

func (e exceeded) err() error {
	if len(e) == 0 {
		return nil
	}
	return fmt.Errorf("figures past their limits:\n\t%s", strings.Join(e, "\n\t"))
}

type staticFigures struct {
	processorMethods            []string
	wholeMessage                []string
	sendsOutsideLoop            []string
	longFuncs, longFiles        []string
	supportImports              []string
	productLines, adapterLines  int
	domainLines                 int
	loopFile, loopFunc          string
	longFuncLimit, longFileLimt int
}

func static(root string, files []string) (*staticFigures, error) {
	st := &staticFigures{longFuncLimit: 80, longFileLimt: 500}
	fset := token.NewFileSet()
	for _, rel := range files {
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		lines := bytes.Count(src, []byte("\n"))
		st.productLines += lines
		dir := filepath.ToSlash(filepath.Dir(rel))
		switch dir {
		case "internal/extproc":
			st.adapterLines += lines
		case "internal/attempt", "internal/idem":
			st.domainLines += lines
		}
		if lines > st.longFileLimt {
			st.longFiles = append(st.longFiles, fmt.Sprintf("%s (%d lines)", rel, lines))
		}
		extprocName := ""
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, module+"/") && wings.InSupport(strings.TrimPrefix(path, module+"/"), supportDirs) {
				st.supportImports = append(st.supportImports, rel+" imports "+path)
			}
			if path == "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3" {
				extprocName = "extprocv3"
				if imp.Name != nil {
					extprocName = imp.Name.Name
				}
			}
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := funcName(fd)
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n > st.longFuncLimit {
				st.longFuncs = append(st.longFuncs, fmt.Sprintf("%s %s (%d lines)", rel, name, n))
			}
			if dir == "internal/extproc" && recvType(fd) == "processor" {
				st.processorMethods = append(st.processorMethods, name)
			}
			if extprocName != "" && takesWholeMessage(fd, extprocName) {
				st.wholeMessage = append(st.wholeMessage, rel+" "+name)
			}
			if dir == "internal/extproc" {
				recv := false
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					if c, ok := n.(*ast.CallExpr); ok {
						if s, ok := c.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "Recv" && len(c.Args) == 0 {
							recv = true
						}
					}
					return true
				})
				if recv && st.loopFunc == "" {
					st.loopFile, st.loopFunc = rel, funcName(fd)
				}
			}
		}
	}
	// Sends: every call of a Send or send method (the stream's, or the
	// processor's send field) in the adapter, outside the stream loop.
	for _, rel := range files {
		if filepath.ToSlash(filepath.Dir(rel)) != "internal/extproc" {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil || (rel == st.loopFile && funcName(fd) == st.loopFunc) {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				c, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if s, ok := c.Fun.(*ast.SelectorExpr); ok && (s.Sel.Name == "Send" || s.Sel.Name == "send") {
					st.sendsOutsideLoop = append(st.sendsOutsideLoop,
						fmt.Sprintf("%s:%d %s", rel, fset.Position(c.Pos()).Line, funcName(fd)))
				}
				return true
			})
		}
	}
	return st, nil
}

func recvType(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

func funcName(fd *ast.FuncDecl) string {
	if r := recvType(fd); r != "" {
		return r + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// takesWholeMessage reports a parameter of type *extprocv3.ProcessingRequest.
func takesWholeMessage(fd *ast.FuncDecl, pkg string) bool {
	for _, field := range fd.Type.Params.List {
		s, ok := field.Type.(*ast.StarExpr)
		if !ok {
			continue
		}
		if sel, ok := s.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "ProcessingRequest" {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == pkg {
				return true
			}
		}
	}
	return false
}

func (st *staticFigures) print(verbose bool, ex *exceeded) {
	list := func(title string, items []string, limit string) {
		fmt.Printf("%-52s %4d   %s\n", title, len(items), limit)
		if verbose {
			for _, it := range items {
				fmt.Printf("    %s\n", it)
			}
		}
	}
	fmt.Printf("stream loop: %s %s\n", st.loopFile, st.loopFunc)
	fmt.Printf("%-52s %4d\n", "product lines", st.productLines)
	fmt.Printf("%-52s %4d\n", "  of which the adapter (internal/extproc)", st.adapterLines)
	fmt.Printf("%-52s %4d\n", "  of which the domain (attempt, idem)", st.domainLines)
	limited := func(title string, items []string, max int) { list(title, items, ex.limit(title, len(items), max)) }
	limited("processor methods", st.processorMethods, 30)
	limited("signatures taking the whole ProcessingRequest", st.wholeMessage, 6)
	limited("sends outside the stream loop", st.sendsOutsideLoop, 0)
	limited("product functions over 80 lines", st.longFuncs, 0)
	limited("product files over 500 lines", st.longFiles, 0)
	list("product imports of the test-support wing", st.supportImports, "(only cmd/idem-extproc/demo.go's envoysim)")
}

// event is one function entry or exit the instrumented copy recorded.
type event struct {
	G     int64  `json:"g"`
	File  string `json:"file"`
	Func  string `json:"func"`
	Enter bool   `json:"enter"`
	// Value: the function receives the per-stream value (a processor or
	// an attempt, as receiver or parameter).
	Value bool `json:"value"`
}

// walkFigures are the walk's counts, twice: as read (each function is
// read once: a call to a function already read is not followed into
// again, though what it calls for the first time is) and as run (every
// call).
type walkFigures struct {
	scope    string
	follow   string
	read     walkCount
	run      walkCount
	trail    []string // the entries as read
	runTrail []string // every entry, as run
}

type walkCount struct{ files, entries, returns int }

// print prints the walk; the default walk's limits hold the figures as
// run.
func (w *walkFigures) print(verbose bool, ex *exceeded) {
	limit := func(title string, n, max int) string {
		if w.scope != defaultScope || w.follow != defaultFollow {
			return ""
		}
		return ex.limit(title, n, max)
	}
	fmt.Printf("walk (first write, then its replay; -scope %s -follow %s)\n", w.scope, w.follow)
	fmt.Printf("%-52s %7s %7s\n", "", "as read", "as run")
	fmt.Printf("%-52s %7d %7d   %s\n", "  files entered", w.read.files, w.run.files,
		limit("walk: files entered", w.run.files, 10))
	fmt.Printf("%-52s %7d %7d\n", "  entries into a file", w.read.entries, w.run.entries)
	fmt.Printf("%-52s %7d %7d   %s\n", "  returns to a file already left", w.read.returns, w.run.returns,
		limit("walk: returns to a file already left", w.run.returns, 15))
	if verbose {
		fmt.Println("  as read:")
		for _, t := range w.trail {
			fmt.Printf("    %s\n", t)
		}
		fmt.Println("  as run:")
		for _, t := range w.runTrail {
			fmt.Printf("    %s\n", t)
		}
	}
}

func measureWalk(root string, files []string, loopFile, loopFunc, scope, follow string) (*walkFigures, error) {
	if loopFunc == "" {
		return nil, fmt.Errorf("no stream loop (a function of internal/extproc that calls Recv) found")
	}
	tmp, err := os.MkdirTemp("", "archfigures-")
	if err != nil {
		return nil, err
	}
	if os.Getenv("ARCHFIGURES_KEEP") == "" {
		defer os.RemoveAll(tmp)
	} else {
		fmt.Fprintln(os.Stderr, "archfigures: keeping", tmp)
	}
	// The root module's go.mod and go.sum, and its internal tree.
	for _, name := range []string{"go.mod", "go.sum"} {
		if err := copyFile(filepath.Join(root, name), filepath.Join(tmp, name)); err != nil {
			return nil, err
		}
	}
	if err := copyTree(filepath.Join(root, "internal"), filepath.Join(tmp, "internal")); err != nil {
		return nil, err
	}
	for _, rel := range files {
		if !strings.HasPrefix(rel, "internal/") {
			continue
		}
		if err := instrument(filepath.Join(tmp, rel), rel); err != nil {
			return nil, fmt.Errorf("instrumenting %s: %w", rel, err)
		}
	}
	if err := writeFile(filepath.Join(tmp, "internal/archtrace/archtrace.go"), recorderSource); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(tmp, "internal/archtrace/drive_test.go"), driverSource); err != nil {
		return nil, err
	}
	out := filepath.Join(tmp, "events.json")
	// -trimpath: the copy is at a new path each run, and without it the
	// build cache keys every package by its directory; -vet=off: the copy
	// is instrumented, and the repository's own vet reads the real files.
	cmd := exec.Command("go", "test", "-trimpath", "-vet=off", "-count=1", "-run", "TestWalk", "./internal/archtrace/")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "ARCHTRACE_OUT="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("running the exchange: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	var rec struct {
		G      int64   `json:"g"`
		Events []event `json:"events"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, err
	}
	inScope := func(file string) bool {
		if scope == "product" {
			return true
		}
		for _, d := range strings.Split(scope, ",") {
			if filepath.ToSlash(filepath.Dir(file)) == strings.TrimSuffix(d, "/") {
				return true
			}
		}
		return false
	}
	w := &walkFigures{scope: scope, follow: follow}
	visited := map[string]bool{}   // files, as run
	readFiles := map[string]bool{} // files, as read
	readFuncs := map[string]bool{} // functions already read
	var stack []frame
	loops := 0
	for _, e := range rec.Events {
		if e.G != rec.G {
			continue
		}
		if len(stack) == 0 {
			if e.Enter && e.File == loopFile && e.Func == loopFunc {
				stack = append(stack, frame{e.File, true})
				visited[e.File], readFiles[e.File], readFuncs[e.File+" "+e.Func] = true, true, true
				loops++
				w.trail = append(w.trail, fmt.Sprintf("stream %d: %s %s", loops, e.File, e.Func))
				w.runTrail = append(w.runTrail, w.trail[len(w.trail)-1])
			}
			continue
		}
		if !e.Enter {
			stack = stack[:len(stack)-1]
			continue
		}
		in := inScope(e.File) && (follow == "all" || e.Value)
		stack = append(stack, frame{e.File, in})
		if !in {
			continue
		}
		from := ""
		for i := len(stack) - 2; i >= 0; i-- {
			if stack[i].in {
				from = stack[i].file
				break
			}
		}
		if e.File == from {
			readFuncs[e.File+" "+e.Func] = true
			continue
		}
		w.run.entries++
		back := ""
		if visited[e.File] {
			w.run.returns++
			back = "  (back)"
		}
		visited[e.File] = true
		w.runTrail = append(w.runTrail, fmt.Sprintf("%*s%s %s%s", 2*countIn(stack), "", e.File, e.Func, back))
		if readFuncs[e.File+" "+e.Func] {
			continue
		}
		readFuncs[e.File+" "+e.Func] = true
		w.read.entries++
		mark := ""
		if readFiles[e.File] {
			w.read.returns++
			mark = "  (back)"
		}
		readFiles[e.File] = true
		w.trail = append(w.trail, fmt.Sprintf("%*s%s %s%s", 2*countIn(stack), "", e.File, e.Func, mark))
	}
	if loops != 2 {
		return nil, fmt.Errorf("the stream loop ran %d times, want 2 (one per stream)", loops)
	}
	w.run.files, w.read.files = len(visited), len(readFiles)
	return w, nil
}

// frame is one call on the followed goroutine's stack; in says whether
// the walk follows its function (-scope).
type frame struct {
	file string
	in   bool
}

func countIn(s []frame) int {
	n := 0
	for _, f := range s {
		if f.in {
			n++
		}
	}
	return n
}

// valueTypes are the per-stream value's types: the processor a stream
// owns, and the attempt it holds.
var valueTypes = map[string]bool{"processor": true, "Attempt": true}

// receivesValue reports a function that receives the per-stream value, as
// its receiver or a parameter.
func receivesValue(fd *ast.FuncDecl) bool {
	if valueTypes[recvType(fd)] {
		return true
	}
	for _, f := range fd.Type.Params.List {
		t := f.Type
		if s, ok := t.(*ast.StarExpr); ok {
			t = s.X
		}
		switch t := t.(type) {
		case *ast.Ident:
			if valueTypes[t.Name] {
				return true
			}
		case *ast.SelectorExpr:
			if valueTypes[t.Sel.Name] {
				return true
			}
		}
	}
	return false
}

// instrument adds `defer archtrace.Enter(file, name, value)()` at the top
// of every function and function literal of one file.
func instrument(path, rel string) error {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		return err
	}
	added := false
	hook := func(body *ast.BlockStmt, name string, value bool) {
		if body == nil {
			return
		}
		call := &ast.CallExpr{Fun: &ast.CallExpr{
			Fun: &ast.SelectorExpr{X: ast.NewIdent("archtrace"), Sel: ast.NewIdent("Enter")},
			Args: []ast.Expr{
				&ast.BasicLit{Kind: token.STRING, Value: strconv.Quote(rel)},
				&ast.BasicLit{Kind: token.STRING, Value: strconv.Quote(name)},
				ast.NewIdent(strconv.FormatBool(value)),
			},
		}}
		body.List = append([]ast.Stmt{&ast.DeferStmt{Call: call}}, body.List...)
		added = true
	}
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok {
			ast.Inspect(decl, func(n ast.Node) bool {
				if fl, ok := n.(*ast.FuncLit); ok {
					hook(fl.Body, "func literal", false)
				}
				return true
			})
			continue
		}
		name := funcName(fd)
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if fl, ok := n.(*ast.FuncLit); ok {
				hook(fl.Body, name+".func", false)
			}
			return true
		})
		hook(fd.Body, name, receivesValue(fd))
	}
	if !added {
		return nil
	}
	imp := &ast.ImportSpec{Path: &ast.BasicLit{Kind: token.STRING, Value: strconv.Quote(module + "/internal/archtrace")}}
	f.Decls = append([]ast.Decl{&ast.GenDecl{Tok: token.IMPORT, Specs: []ast.Spec{imp}}}, f.Decls...)
	f.Imports = append(f.Imports, imp)
	var buf bytes.Buffer
	if err := format.Node(&buf, fset, f); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		return copyFile(path, filepath.Join(dst, rel))
	})
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeFile(dst, string(b))
}

func writeFile(path, s string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	w, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	if _, err := bw.WriteString(s); err != nil {
		w.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}
