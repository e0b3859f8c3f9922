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
// it). A document that is not YAML, empty or two documents is an error:
// nothing further can be read from it. A key with no value is a problem
// reported with every other mistake of the file (a null sets nothing, so
// the rest still decodes); doc is the document's root, for paths.
func checkComplete(name string, data []byte) (sh shape, doc *yaml.Node, found problems, err error) {
	sh.ended = endsWithMarker(data)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return sh, nil, nil, fmt.Errorf("%s: the file is empty; an empty file is taken for a truncated one and refused "+
				"(write `policies: []` to protect only with default_policy)", name)
		}
		return sh, nil, nil, yamlError(name, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		return sh, nil, nil, fmt.Errorf("%s:%d: a second YAML document; the file holds exactly one", name, next.Line)
	} else if !errors.Is(err, io.EOF) {
		return sh, nil, nil, yamlError(name, err)
	}
	doc = &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	if isNull(doc) {
		return sh, nil, nil, fmt.Errorf("%s: the file holds no settings; an empty file is taken for a truncated one and refused "+
			"(write `policies: []` to protect only with default_policy)", name)
	}
	walk(doc, "", func(k, v *yaml.Node, path string) {
		// No option of the file takes null, so each is a mistake or a cut.
		if !isNull(v) {
			return
		}
		line := v.Line
		if k != nil {
			line = k.Line // `key:` alone: the line of the key, which names it
		}
		found = append(found, problem{line: line, unset: path,
			err: fmt.Errorf("%s:%d: %s: no value (a file cut short?); write a value or delete the line", name, line, path)})
	})
	if doc.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(doc.Content); i += 2 {
			if k, v := doc.Content[i], doc.Content[i+1]; k.Value == "policies" && v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
				sh.explicitlyEmpty = true
			}
		}
	}
	return sh, doc, found, nil
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// walk calls visit for every mapping value (with its key) and list item
// (with a nil key) under n, with its path in the file (policies[0].match),
// in document order. Aliases are not followed: what they name is visited
// where it is written.
func walk(n *yaml.Node, path string, visit func(key, value *yaml.Node, path string)) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := childPath(path, k.Value)
			visit(k, v, p)
			walk(v, p, visit)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			visit(nil, c, p)
			walk(c, p, visit)
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
