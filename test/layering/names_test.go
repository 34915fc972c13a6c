package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// TestNoKindOrFormatNamesCompared: outside operators/, where each step kind
// is declared by its spec, no code compares a step's kind or a value's
// format with a name written as a string (`s.Kind == "window"`, `switch
// d.Source.Format { case "raw": }`). What a step is comes from its
// traits (operators.Traits, kept in rules.StepSpec), and a format is a
// rules.Format constant read once from the rule file.
func TestNoKindOrFormatNamesCompared(t *testing.T) {
	names := map[string]string{}
	for _, k := range operators.StepKinds() {
		names[k] = "step kind"
	}
	for _, f := range []rules.Format{rules.FormatJSON, rules.FormatRaw, rules.FormatAvro, rules.FormatProtobuf} {
		names[string(f)] = "format"
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	// kindOrFormat reports whether e reads a kind or a format: x.Kind,
	// x.Kind(), x.Format.
	kindOrFormat := func(e ast.Expr) bool {
		if c, ok := e.(*ast.CallExpr); ok && len(c.Args) == 0 {
			e = c.Fun
		}
		s, ok := e.(*ast.SelectorExpr)
		return ok && (s.Sel.Name == "Kind" || s.Sel.Name == "Format")
	}
	name := func(e ast.Expr) (string, bool) {
		l, ok := e.(*ast.BasicLit)
		if !ok || l.Kind != token.STRING {
			return "", false
		}
		v, err := strconv.Unquote(l.Value)
		if err != nil {
			return "", false
		}
		_, ok = names[v]
		return v, ok
	}
	fset := token.NewFileSet()
	checked := 0
	for _, p := range listModule(t) {
		self, _ := local(p.ImportPath)
		if self == "operators" || strings.HasPrefix(self, "test/") {
			continue
		}
		for _, f := range p.GoFiles {
			path := filepath.Join(root, filepath.FromSlash(self), f)
			file, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			report := func(at token.Pos, n string) {
				rel, _ := filepath.Rel(root, fset.Position(at).Filename)
				t.Errorf("%s:%d: compares a %s with the name %q; decide by the step's traits or a rules.Format constant", rel, fset.Position(at).Line, names[n], n)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.BinaryExpr:
					if x.Op != token.EQL && x.Op != token.NEQ {
						break
					}
					if v, ok := name(x.Y); ok && kindOrFormat(x.X) {
						report(x.Pos(), v)
					} else if v, ok := name(x.X); ok && kindOrFormat(x.Y) {
						report(x.Pos(), v)
					}
				case *ast.SwitchStmt:
					if x.Tag == nil || !kindOrFormat(x.Tag) {
						break
					}
					for _, st := range x.Body.List {
						for _, e := range st.(*ast.CaseClause).List {
							if v, ok := name(e); ok {
								report(e.Pos(), v)
							}
						}
					}
				}
				return true
			})
		}
	}
	if checked < 50 {
		t.Fatalf("only %d files checked", checked)
	}
}
