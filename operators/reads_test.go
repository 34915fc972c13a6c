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

// TestExprBoundReads: what an expression reads of a name a join bound,
// which a stream join's second input is decoded by (only those members).
func TestExprBoundReads(t *testing.T) {
	for _, c := range []struct {
		src     string
		members []string
		whole   bool
	}{
		{`auth.id`, []string{"id"}, false},
		{`auth?.approved && auth["id"] != ""`, []string{"approved", "id"}, false},
		{`auth != nil`, nil, false},
		{`nil == auth || auth.x > 1`, []string{"x"}, false},
		{`value.a`, nil, false},
		{`auth`, nil, true},
		{`auth == value`, nil, true},
		{`auth[key]`, nil, true},
		{`auth.a + len(auth)`, []string{"a"}, true},
		{`let v = auth; v.a`, nil, true},
		{`$env.value`, nil, true},
		{`all(auth.items, {# > auth.min})`, []string{"items", "min"}, false},
		{`auth.card.country`, []string{"card"}, false},
	} {
		e, err := CompileExpr(c.src, []string{"auth"})
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		m, w := e.BoundReads("auth")
		slices.Sort(m)
		if !slices.Equal(m, c.members) || w != c.whole {
			t.Errorf("%s: members %v whole %v, want %v %v", c.src, m, w, c.members, c.whole)
		}
	}
}
