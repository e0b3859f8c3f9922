package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// endMarker is YAML's document end marker. A file whose last line is
// endMarker says it is complete: once the configuration in force ends with
// it, a new file that does not is taken for a truncated copy (Source).
const endMarker = "..."

// shape is what the structural checks learnt about a document.
type shape struct {
	// explicitlyEmpty: the document says `policies: []`.
	explicitlyEmpty bool
	// ended: the file's last line is the end marker.
	ended bool
}

// checkComplete refuses documents that look like a file cut short: an
// empty one, a key with no value (a file cut right after "key:"), or more
// than one document. These are what an in-place rewrite caught half way
// usually leaves; a cut at a line boundary that leaves a valid smaller
// document is not seen here (see Source for the end marker that catches
// it).
func checkComplete(name string, data []byte) (shape, error) {
	var sh shape
	sh.ended = endsWithMarker(data)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return sh, fmt.Errorf("%s: the file is empty; an empty file is taken for a truncated one and refused "+
				"(write `policies: []` to protect only with default_policy)", name)
		}
		return sh, yamlError(name, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		return sh, fmt.Errorf("%s:%d: a second YAML document; the file holds exactly one", name, next.Line)
	} else if !errors.Is(err, io.EOF) {
		return sh, yamlError(name, err)
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	if isNull(doc) {
		return sh, fmt.Errorf("%s: the file holds no settings; an empty file is taken for a truncated one and refused "+
			"(write `policies: []` to protect only with default_policy)", name)
	}
	var errs []error
	walkNulls(doc, "", func(line int, path string) {
		errs = append(errs, fmt.Errorf("%s:%d: %s: no value (a file cut short?); write a value or delete the line", name, line, path))
	})
	if doc.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(doc.Content); i += 2 {
			if k, v := doc.Content[i], doc.Content[i+1]; k.Value == "policies" && v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
				sh.explicitlyEmpty = true
			}
		}
	}
	return sh, errors.Join(errs...)
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// walkNulls calls found for every mapping value and list item that is
// null: `key:` with nothing after it, or `- ` alone. No option of the file
// takes null, so each is a mistake or a cut.
func walkNulls(n *yaml.Node, path string, found func(line int, path string)) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if isNull(v) {
				found(k.Line, p)
				continue
			}
			walkNulls(v, p, found)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if isNull(c) {
				found(c.Line, p)
				continue
			}
			walkNulls(c, p, found)
		}
	}
}

// endsWithMarker reports whether the last non-blank line is the end
// marker.
func endsWithMarker(data []byte) bool {
	data = bytes.TrimRight(data, " \t\r\n")
	i := bytes.LastIndexByte(data, '\n')
	return string(data[i+1:]) == endMarker // at the line's start: indented, it would be a value
}
