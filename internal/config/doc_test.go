package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestEveryOptionIsDocumented walks the file's schema (the yaml tags the
// strict decoder accepts) and finds each option in docs/configuration.md
// and in the annotated example, so that an option cannot be added
// without its documentation. A setting is named by its dotted path
// (`key.header`); the criteria of a match and the fields of list entries
// (`exact`, `status`) by their own names, as the page writes them.
func TestEveryOptionIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(doc)
	example, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	var options []option
	// The document's own parts (`defaults`, `policies`, `name`, `match`, …)
	// are named alone; settings relative to wherever they appear.
	collect(reflect.TypeFor[document](), "", true, &options)
	if len(options) < 30 {
		t.Fatalf("found only %d options: has the schema's shape changed?", len(options))
	}
	seen := map[option]bool{}
	for _, o := range options {
		if seen[o] {
			continue // settings appear under defaults, each policy and the default policy
		}
		seen[o] = true
		name := o.path
		if o.short {
			name = o.path[strings.LastIndex(o.path, ".")+1:]
		}
		if !strings.Contains(section, "`"+name+"`") && !strings.Contains(section, "`"+name+":") &&
			!strings.Contains(section, " "+name+":") && !strings.Contains(section, "\n"+name+":") {
			t.Errorf("docs/configuration.md does not mention `%s` (%s)", name, o.path)
		}
		leaf := o.path[strings.LastIndex(o.path, ".")+1:]
		if !strings.Contains(string(example), leaf+":") {
			t.Errorf("examples/policies.yaml never sets %s (%s)", leaf, o.path)
		}
	}
}

type option struct {
	path  string
	short bool // named by its last element alone
}

var leafTypes = map[reflect.Type]bool{reflect.TypeFor[scalar](): true, reflect.TypeFor[scalars](): true}

// collect appends the options under type t, a struct of the schema.
func collect(t reflect.Type, prefix string, short bool, out *[]option) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if f.Type == reflect.TypeFor[settings]() {
			if opts != "inline" {
				*out = append(*out, option{path: prefix + tag, short: short})
			}
			collect(f.Type, "", false, out)
			continue
		}
		if tag == "" || tag == "-" {
			continue
		}
		path := prefix + tag
		ft := f.Type
		switch {
		case leafTypes[ft]:
			*out = append(*out, option{path: path, short: short})
		case ft.Kind() == reflect.Slice:
			*out = append(*out, option{path: path, short: short})
			collect(ft.Elem(), path+".", true, out)
		case ft.Kind() == reflect.Struct:
			// A struct is documented through its fields. A match's criteria are listed by name, not as match.hosts.
			collect(ft, path+".", short || tag == "match", out)
		}
	}
}
