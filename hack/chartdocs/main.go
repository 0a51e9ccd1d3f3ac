// Command chartdocs generates a Helm chart's values.schema.json and the
// values table of its README.md from the comments of its values.yaml, so
// that neither can drift from the values (make generate runs it; make
// verify fails on a diff).
//
// Every key in values.yaml has a comment above it whose first line starts
// with "# --": its description, continued on the following "#" lines. A line
// "# @schema {...}" adds JSON Schema keywords to the key's schema (an enum,
// a minimum, the items of a list). The type comes from the default: a
// non-empty mapping is a section whose keys are the only ones allowed, an
// empty mapping ({}) is free-form, a list is an array, a scalar its own type.
//
//	go run . <chart directory>
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: chartdocs <chart directory>")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "chartdocs:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	src, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		return err
	}
	keys, err := parse(src)
	if err != nil {
		return fmt.Errorf("values.yaml: %w", err)
	}
	schema, err := json.MarshalIndent(rootSchema(keys), "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "values.schema.json"), append(schema, '\n'), 0o644); err != nil {
		return err
	}
	readme := filepath.Join(dir, "README.md")
	doc, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	out, err := splice(doc, table(keys))
	if err != nil {
		return fmt.Errorf("README.md: %w", err)
	}
	return os.WriteFile(readme, out, 0o644)
}

// key is one documented key of values.yaml.
type key struct {
	path     string // dotted, from the root
	doc      string
	extra    map[string]any // the @schema keywords
	node     *yaml.Node     // its default
	children []*key         // a section's keys
}

func parse(src []byte) ([]*key, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("not a mapping")
	}
	return mapping(doc.Content[0], "")
}

func mapping(m *yaml.Node, prefix string) ([]*key, error) {
	var out []*key
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		path := prefix + k.Value
		doc, extra, err := comment(k.HeadComment)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if doc == "" {
			return nil, fmt.Errorf(`%s (line %d) has no "# --" comment above it`, path, k.Line)
		}
		kk := &key{path: path, doc: doc, extra: extra, node: v}
		if v.Kind == yaml.MappingNode && len(v.Content) > 0 && !freeForm(extra) {
			if kk.children, err = mapping(v, path+"."); err != nil {
				return nil, err
			}
		}
		out = append(out, kk)
	}
	return out, nil
}

// freeForm says the @schema keywords make a mapping accept any keys.
func freeForm(extra map[string]any) bool {
	v, ok := extra["additionalProperties"]
	return ok && v != false
}

// comment returns the description of a key's head comment (its last
// paragraph that starts with "# --") and its @schema keywords.
func comment(head string) (string, map[string]any, error) {
	var doc []string
	var extra map[string]any
	in := false
	for line := range strings.SplitSeq(head, "\n") {
		text := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		switch {
		case strings.HasPrefix(text, "-- "):
			doc, extra, in = []string{strings.TrimPrefix(text, "-- ")}, nil, true
		case strings.HasPrefix(text, "@schema "):
			if !in {
				return "", nil, errors.New("@schema before the \"# --\" line")
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(text, "@schema ")), &extra); err != nil {
				return "", nil, fmt.Errorf("@schema: %w", err)
			}
		case in && text != "":
			doc = append(doc, text)
		case text == "":
			in = in && len(doc) == 0
		}
	}
	return strings.Join(doc, " "), extra, nil
}

// object is a JSON object that keeps its keys in order.
type object struct {
	keys []string
	vals map[string]any
}

func (o *object) set(k string, v any) {
	if o.vals == nil {
		o.vals = map[string]any{}
	}
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

func (o *object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kj, _ := json.Marshal(k)
		vj, err := json.Marshal(o.vals[k])
		if err != nil {
			return nil, err
		}
		b.Write(kj)
		b.WriteByte(':')
		b.Write(vj)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func rootSchema(keys []*key) *object {
	s := &object{}
	s.set("$schema", "http://json-schema.org/draft-07/schema#")
	s.set("title", "Values of the skiff chart (generated from values.yaml by hack/chartdocs)")
	s.set("type", "object")
	s.set("additionalProperties", false)
	s.set("properties", properties(keys))
	return s
}

func properties(keys []*key) *object {
	p := &object{}
	for _, k := range keys {
		p.set(k.path[strings.LastIndex(k.path, ".")+1:], schemaOf(k))
	}
	return p
}

func schemaOf(k *key) *object {
	s := &object{}
	s.set("description", k.doc)
	if t := typeOf(k.node); t != "" {
		s.set("type", t)
	}
	if k.children != nil {
		s.set("additionalProperties", false)
		s.set("properties", properties(k.children))
	}
	for _, name := range slices.Sorted(maps.Keys(k.extra)) {
		s.set(name, k.extra[name])
	}
	return s
}

func typeOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "object"
	case yaml.SequenceNode:
		return "array"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!bool":
			return "boolean"
		case "!!int":
			return "integer"
		case "!!float":
			return "number"
		case "!!str":
			return "string"
		}
	}
	return ""
}

const begin, end = "<!-- values:begin (generated from values.yaml by make generate) -->", "<!-- values:end -->"

// table is the README's values table: every key, sections included.
func table(keys []*key) string {
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n|---|---|---|---|\n")
	var walk func([]*key)
	walk = func(keys []*key) {
		for _, k := range keys {
			def := "see below"
			if k.children == nil {
				def = "`" + strings.ReplaceAll(defaultOf(k.node), "|", `\|`) + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.path, typeOf(k.node), def, cell.Replace(k.doc))
			walk(k.children)
		}
	}
	walk(keys)
	return b.String()
}

// cell escapes a description for a Markdown table cell.
var cell = strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;")

// defaultOf renders a default on one line, as JSON ("" for an empty string).
func defaultOf(n *yaml.Node) string {
	var v any
	if err := n.Decode(&v); err != nil {
		return n.Value
	}
	j, err := json.Marshal(v)
	if err != nil {
		return n.Value
	}
	return string(j)
}

func splice(doc []byte, tbl string) ([]byte, error) {
	s := string(doc)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return nil, fmt.Errorf("no %q ... %q section", begin, end)
	}
	return []byte(s[:i+len(begin)] + "\n\n" + tbl + "\n" + s[j:]), nil
}
