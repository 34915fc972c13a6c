package operators

import (
	"slices"
	"testing"
)

func TestExprValueReads(t *testing.T) {
	for _, c := range []struct {
		src     string
		members []string
		whole   bool
	}{
		{`value.amount > 0 && value.card.country == "FR"`, []string{"amount", "card"}, false},
		{`value?.a ?? value["b"]`, []string{"a", "b"}, false},
		{`len(value.items) + len(headers)`, []string{"items"}, false},
		{`key + topic`, nil, false},
		{`value`, nil, true},
		{`value[key]`, nil, true},
		{`value.a + len(value)`, []string{"a"}, true},
		{`let v = value; v.a`, nil, true},
		{`$env.value.a`, nil, true},
		{`all(value.items, {# > value.min})`, []string{"items", "min"}, false},
	} {
		e, err := CompileExpr(c.src, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		m, w := e.ValueReads()
		slices.Sort(m)
		if !slices.Equal(m, c.members) || w != c.whole {
			t.Errorf("%s: members %v whole %v, want %v %v", c.src, m, w, c.members, c.whole)
		}
	}
}
