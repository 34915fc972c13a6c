package rules

import (
	"strings"

	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/operators"
)

// overBudget refuses an expression that reads nothing of the record and
// goes over the expression budget (limits.expr_*) when evaluated: it would
// do so for every record, making each a dead letter (a guard: refusing
// every batch). `len(repeat(repeat("x", 999999), 1000000))` used to pass
// the check and take the process down at the first record (issue 25).
// Expressions that read the record are bounded at run time only.
func (l *loader) overBudget(n *yaml.Node, src, what string, e *operators.Expr) bool {
	tree, err := parser.ParseWithConfig(src, aggConfig())
	if err != nil {
		return false
	}
	var reads readsRecord
	ast.Walk(&tree.Node, &reads)
	if reads {
		return false
	}
	if _, err := e.Eval(&operators.Record{}); operators.IsBudget(err) {
		l.errAt(n, src, "%s goes over the expression budget whatever the record holds (%s); every record would fail with it", what, strings.TrimPrefix(firstLine(err.Error()), src+": "))
		return true
	}
	return false
}

// readsRecord is set by any identifier: a field of the record, a join
// name, a `let` variable, a function called by name (conservative: such an
// expression is left to the run-time bound).
type readsRecord bool

func (r *readsRecord) Visit(node *ast.Node) {
	if _, ok := (*node).(*ast.IdentifierNode); ok {
		*r = true
	}
}
