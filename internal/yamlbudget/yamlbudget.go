// Package yamlbudget bounds what YAML aliases expand to.
//
// A YAML document decoded into a yaml.Node keeps each alias as one node
// pointing at its anchor; whoever walks the tree and follows aliases
// (reading a rule file's steps, turning a test file's records into
// values) expands them. Nine levels of `&aN [*aN-1, *aN-1, ... ×9]` are a
// 1.2 KB file that expands to 9^9 (387 million) nodes: `rtproxy test`
// grew to 24 GB on one. Every YAML reader of rtproxy (rule and guard
// files, test files, the proxy config, rendered deploy manifests) calls
// Check on the tree it decoded, before reading it, and refuses the file
// when its aliases would add more than MaxAliasNodes nodes.
//
// Check itself takes time in proportion to the document as written, not
// as expanded: the expanded size of each anchored node is computed once.
package yamlbudget

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// MaxAliasNodes is how many nodes all the aliases of one document may add
// when expanded. The bound protects the reading of the proxy's own config
// file too, so it is not a config key: no legitimate rule, test or config
// file comes near it (a file's aliases usually repeat a few small
// mappings).
const MaxAliasNodes = 1_000_000

// Error is a document over the budget, at the alias that went over.
type Error struct {
	Line, Column int
	Msg          string
}

func (e *Error) Error() string { return fmt.Sprintf("%d:%d: %s", e.Line, e.Column, e.Msg) }

// Check refuses doc when expanding its aliases would add more than
// MaxAliasNodes nodes, or when an alias refers to a node that contains it.
func Check(doc *yaml.Node) error { return CheckLimit(doc, MaxAliasNodes) }

// CheckLimit is Check with another bound.
func CheckLimit(doc *yaml.Node, limit int64) error {
	if doc == nil {
		return nil
	}
	c := &checker{size: map[*yaml.Node]int64{}, limit: limit}
	return c.walk(doc)
}

type checker struct {
	size  map[*yaml.Node]int64 // expanded size of a node; -1 while being computed
	added int64                // nodes the aliases seen so far add
	limit int64
}

// over is the size every size above the limit is clamped to, so that sums
// cannot overflow.
func (c *checker) over() int64 { return c.limit + 1 }

// walk goes through the document as written, in order, adding what each
// alias expands to; the first alias that takes the total over the limit
// is the one the error names.
func (c *checker) walk(n *yaml.Node) error {
	if n == nil {
		return nil
	}
	if n.Kind == yaml.AliasNode {
		s, err := c.expanded(n.Alias, n)
		if err != nil {
			return err
		}
		c.added += s
		if c.added > c.limit {
			return &Error{Line: n.Line, Column: n.Column, Msg: fmt.Sprintf(
				"YAML aliases here expand to more than %d nodes (an alias bomb?): write the repeated part out, or use fewer levels of aliases", c.limit)}
		}
		return nil
	}
	for _, ch := range n.Content {
		if err := c.walk(ch); err != nil {
			return err
		}
	}
	return nil
}

// expanded is the number of nodes n stands for with every alias inside it
// expanded, clamped to limit+1. at is the alias being expanded, for
// errors.
func (c *checker) expanded(n, at *yaml.Node) (int64, error) {
	if n == nil {
		return 0, nil
	}
	if s, ok := c.size[n]; ok {
		if s < 0 {
			return 0, &Error{Line: at.Line, Column: at.Column, Msg: "YAML alias refers to a node that contains it"}
		}
		return s, nil
	}
	c.size[n] = -1
	var s int64 = 1
	if n.Kind == yaml.AliasNode {
		t, err := c.expanded(n.Alias, n)
		if err != nil {
			return 0, err
		}
		s = t
	} else {
		for _, ch := range n.Content {
			t, err := c.expanded(ch, at)
			if err != nil {
				return 0, err
			}
			s += t
			if s > c.limit {
				s = c.over()
			}
		}
	}
	c.size[n] = s
	return s, nil
}
