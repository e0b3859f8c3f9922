package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// problem is one mistake found in a file. Its line puts the report in file
// order.
type problem struct {
	line int
	err  error
	// unset is the part of the document the mistake left undecoded (a
	// value of the wrong kind, a key with no value, the mapping that holds
	// a duplicate key), "" for none: what the checks that run after
	// decoding would say of it ("missing", "empty") is this mistake again.
	unset string
}

// problems collects every mistake of a file, so that one load reports them
// all rather than stopping at the first.
type problems []problem

// join is the report: one line per mistake, in file order (a mistake
// without a line last), nil when there is none.
func (ps problems) join() error {
	if len(ps) == 0 {
		return nil
	}
	sorted := slices.Clone(ps)
	slices.SortStableFunc(sorted, func(a, b problem) int {
		return sortLine(a.line) - sortLine(b.line)
	})
	errs := make([]error, 0, len(sorted))
	for _, p := range sorted {
		errs = append(errs, p.err)
	}
	return errors.Join(errs...)
}

func sortLine(l int) int {
	if l <= 0 {
		return 1 << 30
	}
	return l
}

// nodeIndex finds the path of a node of the document from what yaml.v3's
// messages say of it: a key by its line and name, a value by its line and
// column, or by its line, kind and the Go type it was to fill.
type nodeIndex struct {
	keys   map[keyAt][]string
	values map[valueAt]string
	typed  map[kindAt][]typedPath
	// entries are the paths of the entries of the lists yaml.v3 decodes
	// into Go slices (policies, responses, match.json), by the path of
	// their list.
	entries map[string]string
}

type keyAt struct {
	line int
	name string
}

type valueAt struct{ line, column int }

type kindAt struct {
	line int
	kind yaml.Kind
}

type typedPath struct {
	path   string
	goType string // as reflect.Type.String writes it; "" for a key the type lacks
}

func newNodeIndex(doc *yaml.Node) *nodeIndex {
	x := &nodeIndex{keys: map[keyAt][]string{}, values: map[valueAt]string{}, typed: map[kindAt][]typedPath{},
		entries: map[string]string{}}
	if doc != nil {
		x.add(doc, reflect.TypeFor[document](), "")
	}
	return x
}

// add indexes n, found at path and decoded into t (nil when no field
// takes it), and everything under it. Aliases are not followed: what they
// name is indexed where it is written.
func (x *nodeIndex) add(n *yaml.Node, t reflect.Type, path string) {
	if path != "" {
		x.values[valueAt{n.Line, n.Column}] = path
		tp := typedPath{path: path}
		if t != nil {
			tp.goType = t.String()
		}
		k := kindAt{n.Line, n.Kind}
		x.typed[k] = append(x.typed[k], tp)
	}
	switch n.Kind {
	case yaml.MappingNode:
		var fields map[string]reflect.Type
		if t != nil && t.Kind() == reflect.Struct {
			fields = yamlFields(t)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := childPath(path, k.Value)
			x.keys[keyAt{k.Line, k.Value}] = append(x.keys[keyAt{k.Line, k.Value}], p)
			x.add(v, fields[k.Value], p)
		}
	case yaml.SequenceNode:
		var elem reflect.Type
		switch {
		case t == nil:
		case t.Kind() == reflect.Slice:
			elem = t.Elem()
		case t == reflect.TypeFor[scalars]():
			elem = reflect.TypeFor[scalar]()
		}
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if t != nil && t.Kind() == reflect.Slice {
				x.entries[p] = path
			}
			x.add(c, elem, p)
		}
	}
}

// key returns the path of the next key called name on line. Keys of one
// name on one line are taken in document order, the order yaml.v3 reports
// them in.
func (x *nodeIndex) key(line int, name string) (string, bool) {
	k := keyAt{line, name}
	paths := x.keys[k]
	if len(paths) == 0 {
		return "", false
	}
	x.keys[k] = paths[1:]
	return paths[0], true
}

// dropped lists, by the path of their list, the entries yaml.v3 left out
// of a Go slice, in file order: an entry it could not decode (null, not a
// mapping, or a mapping with a key twice: problem.unset is the entry) is
// not in the slice, and the entries after it move up (go.yaml.in/yaml/v3
// decode.go: decoder.sequence keeps only the entries decoder.unmarshal
// reports good; decoder.mapping reports a mapping with a duplicate key
// bad, decoder.null a null struct).
func (x *nodeIndex) dropped(found problems) map[string][]int {
	out := map[string][]int{}
	for _, p := range found {
		list, ok := x.entries[p.unset]
		if !ok {
			continue
		}
		i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(p.unset, list+"["), "]"))
		if err == nil && !slices.Contains(out[list], i) {
			out[list] = append(out[list], i)
		}
	}
	for _, l := range out {
		slices.Sort(l)
	}
	return out
}

// The messages of yaml.v3's TypeError that decodeProblems rewrites (its
// decoder's terrorf and terror, and scalar's UnmarshalYAML).
var (
	unknownFieldMsg = regexp.MustCompile(`^line (\d+): field (.+) not found in type (\S+)$`)
	wrongKindMsg    = regexp.MustCompile(`^line (\d+): cannot unmarshal (!!\w+)(?: .*)? into (\S+)$`)
	notScalarMsg    = regexp.MustCompile(`^line (\d+): column (\d+): (expected .*)$`)
	duplicateMsg    = regexp.MustCompile(`^line (\d+): mapping key ("(?:[^"\\]|\\.)*") already defined at line (\d+)$`)
)

// decodeProblems turns the mistakes yaml.v3 found while decoding (it goes
// on decoding after each, and reports them together in a TypeError:
// go.yaml.in/yaml/v3 decode.go, decoder.terrors) into
// problems naming the field by its path: `file:12:
// policies[1].match.path.pathprefix: unknown field; did you mean prefix?`.
// A message that cannot be tied to a field keeps yaml.v3's words.
func decodeProblems(name string, te *yaml.TypeError, x *nodeIndex) problems {
	var out problems
	for _, m := range te.Errors {
		m = strings.TrimSpace(m)
		if sm := unknownFieldMsg.FindStringSubmatch(m); sm != nil {
			line, _ := strconv.Atoi(sm[1])
			field := sm[2]
			path, ok := x.key(line, field)
			if !ok {
				out = append(out, problem{line: line, err: fmt.Errorf("%s:%d: unknown field %s", name, line, shownKey(field))})
				continue
			}
			msg := "unknown field"
			if s := suggest(field, fieldsOf(sm[3])); s != "" {
				msg += "; did you mean " + s + "?"
			}
			out = append(out, problem{line: line, err: fmt.Errorf("%s:%d: %s: %s", name, line, path, msg)})
			continue
		}
		if sm := duplicateMsg.FindStringSubmatch(m); sm != nil {
			line, _ := strconv.Atoi(sm[1])
			key, err := strconv.Unquote(sm[2])
			if path, ok := x.key(line, key); ok && err == nil {
				// yaml.v3 leaves the whole mapping that holds the key
				// undecoded.
				parent := strings.TrimSuffix(strings.TrimSuffix(path, shownKey(key)), ".")
				out = append(out, problem{line: line, unset: parent,
					err: fmt.Errorf("%s:%d: %s: already defined at line %s", name, line, path, sm[3])})
				continue
			}
		}
		if sm := notScalarMsg.FindStringSubmatch(m); sm != nil {
			line, _ := strconv.Atoi(sm[1])
			column, _ := strconv.Atoi(sm[2])
			if path, ok := x.values[valueAt{line, column}]; ok {
				out = append(out, problem{line: line, unset: path, err: fmt.Errorf("%s:%d: %s: %s", name, line, path, sm[3])})
			} else {
				out = append(out, problem{line: line, err: fmt.Errorf("%s:%d: %s", name, line, sm[3])})
			}
			continue
		}
		if sm := wrongKindMsg.FindStringSubmatch(m); sm != nil {
			line, _ := strconv.Atoi(sm[1])
			found := map[string]yaml.Kind{"!!seq": yaml.SequenceNode, "!!map": yaml.MappingNode}[sm[2]]
			if found == 0 {
				found = yaml.ScalarNode
			}
			var paths []string
			for _, tp := range x.typed[kindAt{line, found}] {
				if tp.goType == sm[3] {
					paths = append(paths, tp.path)
				}
			}
			if len(paths) == 1 {
				msg := fmt.Sprintf("expected %s, found a %s", expectedKind(sm[3]), kindName(found))
				out = append(out, problem{line: line, unset: paths[0], err: fmt.Errorf("%s:%d: %s: %s", name, line, paths[0], msg)})
				continue
			}
		}
		if sm := linePrefix.FindStringSubmatch(m); sm != nil {
			line, _ := strconv.Atoi(sm[1])
			out = append(out, problem{line: line, err: fmt.Errorf("%s:%d: %s", name, line, hideContents(m[len(sm[0]):]))})
			continue
		}
		out = append(out, problem{err: fmt.Errorf("%s: %s", name, hideContents(strings.TrimPrefix(m, "yaml: ")))})
	}
	return out
}

// A file pointed at by mistake may be a secret (a key, a token, a shadow
// file), and errors go to logs: they name the file, line and field, never
// what the file holds. Keys of the policy file's own fields are lower-case
// words joined by underscores, so a key written like one is named (a
// misspelt field must be found); any other key is hidden by shownKey, and
// the values and tags yaml.v3 quotes in its messages by hideContents.
var (
	fieldLike = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)
	// yaml.v3 quotes a value in backquotes (decoder.terror), a key in
	// double quotes (%#v, decoder.mapping) and an anchor in single quotes
	// (decoder.alias, decoder.unmarshal): go.yaml.in/yaml/v3 decode.go.
	quoted    = regexp.MustCompile("`[^`]*`|\"(?:[^\"\\\\]|\\\\.)*\"|'[^']*'")
	customTag = regexp.MustCompile(`cannot unmarshal ![^!\s]\S*`)
)

// shownKey is key as an error shows it.
func shownKey(key string) string {
	if fieldLike.MatchString(key) {
		return key
	}
	return "(a key not shown)"
}

// childPath is the path of key's value in the mapping at path.
func childPath(path, key string) string {
	if path == "" {
		return shownKey(key)
	}
	return path + "." + shownKey(key)
}

// hideContents takes out of a yaml.v3 message the values, keys, anchors
// and tags it quotes from the file.
func hideContents(m string) string {
	m = customTag.ReplaceAllLiteralString(m, "cannot unmarshal a tagged value")
	return strings.ReplaceAll(quoted.ReplaceAllLiteralString(m, "(not shown)"), " (not shown) into", " into")
}

// expectedKind says what a value of the Go type yaml.v3 names (as
// reflect.Type.String writes it) is written as.
func expectedKind(goType string) string {
	if strings.HasPrefix(goType, "[]") {
		return "a list"
	}
	return "a mapping"
}

// fieldsOf lists the keys the document type called typeName (as yaml.v3
// names it in "not found in type config.pathMatch") accepts, its inline
// settings included, in field order.
func fieldsOf(typeName string) []string {
	var found []string
	seen := map[reflect.Type]bool{}
	var visit func(t reflect.Type)
	visit = func(t reflect.Type) {
		for t.Kind() == reflect.Slice || t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] || found != nil {
			return
		}
		seen[t] = true
		if t.String() == typeName {
			found = yamlKeys(t)
			return
		}
		for i := range t.NumField() {
			visit(t.Field(i).Type)
		}
	}
	visit(reflect.TypeFor[document]())
	return found
}

// yamlKeys lists the keys a struct accepts, in field order, with those of
// its inline fields in their place.
func yamlKeys(t reflect.Type) []string {
	var keys []string
	eachYAMLField(t, func(key string, _ reflect.Type) { keys = append(keys, key) })
	return keys
}

// yamlFields maps the keys a struct accepts to the types they fill.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	eachYAMLField(t, func(key string, ft reflect.Type) { fields[key] = ft })
	return fields
}

// eachYAMLField calls f for each key of struct t as yaml.v3 reads its tags
// (the key before the first comma; an inline field's keys in its place).
func eachYAMLField(t reflect.Type, f func(key string, ft reflect.Type)) {
	for i := range t.NumField() {
		sf := t.Field(i)
		key, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if slices.Contains(strings.Split(opts, ","), "inline") {
			eachYAMLField(sf.Type, f)
			continue
		}
		if !sf.IsExported() || key == "-" {
			continue
		}
		if key == "" {
			key = strings.ToLower(sf.Name)
		}
		f(key, sf.Type)
	}
}

// suggest returns the key among known that an unknown one most likely
// misspells: the same letters but for case, '_' and '-' (retryAfter), one
// or two letters off (retentoin), or a known key within it (pathprefix for
// prefix); "" when none is close.
func suggest(unknown string, known []string) string {
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(s))
	}
	u := norm(unknown)
	best, bestScore := "", 1<<30
	for _, k := range known {
		n := norm(k)
		score := editDistance(u, n)
		limit := 2
		if len(n) <= 4 {
			limit = 1
		}
		switch {
		case score <= limit:
		case len(n) >= 4 && strings.Contains(u, n):
			score = limit + 1 // after every close spelling
		default:
			continue
		}
		if score < bestScore {
			best, bestScore = k, score
		}
	}
	return best
}

// editDistance is the optimal string alignment distance: insertions,
// deletions, substitutions and transpositions of adjacent letters.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
