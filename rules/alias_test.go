package rules

import (
	"fmt"
	"strings"
	"testing"
)

// bombLines are levels of `&aN [*aN-1 ×9]` as top-level keys of a rule
// file, 1.2 KB for nine levels (issue 25, finding 7).
func bombLines(levels int) string {
	var b strings.Builder
	b.WriteString("x-a0: &a0 [x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= levels; i++ {
		r := make([]string, 9)
		for j := range r {
			r[j] = fmt.Sprintf("*a%d", i-1)
		}
		fmt.Fprintf(&b, "x-a%d: &a%d [%s]\n", i, i, strings.Join(r, ", "))
	}
	return b.String()
}

// TestAliasBombInRuleFiles: a route or guard file whose aliases expand
// past the budget is refused with that one error, at the alias that goes
// over, before anything reads the tree.
func TestAliasBombInRuleFiles(t *testing.T) {
	guard := "guard: g\ntopic: t\nchecks: [valid_json]\n"
	for name, file := range map[string]string{
		"route": base + bombLines(9) + "steps:\n  - set: {n: value.x}\n",
		"guard": guard + bombLines(9),
	} {
		got := loadErrors(t, map[string]string{"r.yaml": file})
		line := strings.Count(strings.SplitAfter(file, "x-a6:")[0], "\n") + 1
		want := fmt.Sprintf("r.yaml:%d:", line)
		if len(got) != 1 || !strings.HasPrefix(got[0], want) || !strings.Contains(got[0], "aliases here expand to more than 1000000 nodes") {
			t.Errorf("%s: errors %q, want one alias-budget error at %s", name, got, want)
		}
	}
}
