package yamlbudget

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// Bomb is the alias bomb of issue 25 (finding 7): levels of
// `&aN [*aN-1 × width]` under key, 1.2 KB for nine levels of nine.
func Bomb(key string, levels, width int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "a0: &a0 [x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= levels; i++ {
		refs := make([]string, width)
		for j := range refs {
			refs[j] = fmt.Sprintf("*a%d", i-1)
		}
		fmt.Fprintf(&b, "a%d: &a%d [%s]\n", i, i, strings.Join(refs, ", "))
	}
	fmt.Fprintf(&b, "%s: *a%d\n", key, levels)
	return b.String()
}

func parse(t testing.TB, src string) *yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	return &doc
}

// bruteForce counts the nodes the aliases of n add by expanding them, up
// to cap.
func bruteForce(n *yaml.Node, cap int64) int64 {
	var added int64
	var count func(n *yaml.Node, depth int) int64
	count = func(n *yaml.Node, depth int) int64 {
		if n == nil || depth > 1000 || added > cap {
			return 0
		}
		if n.Kind == yaml.AliasNode {
			return count(n.Alias, depth+1)
		}
		s := int64(1)
		for _, c := range n.Content {
			s += count(c, depth+1)
		}
		return s
	}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n == nil || added > cap {
			return
		}
		if n.Kind == yaml.AliasNode {
			added += count(n.Alias, 0)
			return
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(n)
	return added
}

func TestAliasBomb(t *testing.T) {
	src := Bomb("value", 9, 9)
	if len(src) > 1300 {
		t.Fatalf("bomb is %d bytes", len(src))
	}
	err := Check(parse(t, src))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("nine levels of nine accepted: %v", err)
	}
	// The alias that goes over: the first *a5 on line 7 (a5 alone is
	// 597871 nodes, and the lines above add 672k).
	if e.Line != 7 || !strings.Contains(e.Msg, "more than 1000000 nodes") {
		t.Errorf("error %v, want it at line 7", e)
	}
	// Small, honest reuse passes.
	ok := "base: &b {topic: t, format: json}\nr1: *b\nr2: *b\nlist: [*b, *b, *b]\n"
	if err := Check(parse(t, ok)); err != nil {
		t.Fatal(err)
	}
}

// TestCheckAgreesWithExpansion: Check refuses exactly the documents whose
// aliases, expanded one by one, add more than the limit.
func TestCheckAgreesWithExpansion(t *testing.T) {
	for levels := 1; levels <= 6; levels++ {
		for width := 1; width <= 6; width++ {
			src := Bomb("v", levels, width)
			doc := parse(t, src)
			for _, limit := range []int64{10, 100, 1000, 5000} {
				want := bruteForce(doc, limit) > limit
				got := CheckLimit(doc, limit) != nil
				if got != want {
					t.Fatalf("levels %d width %d limit %d: refused=%v, expansion says %v", levels, width, limit, got, want)
				}
			}
		}
	}
}

func FuzzCheck(f *testing.F) {
	f.Add(Bomb("v", 3, 3))
	f.Add(Bomb("v", 9, 9))
	f.Add("a: &x [1, 2]\nb: [*x, *x, {c: *x}]\n")
	f.Add("a: &x {k: &y [1]}\nb: *y\nc: *x\n")
	f.Add("- &a [a, b]\n- [*a, *a]\n- &b [*a, *a]\n- [*b, *b]\n")
	f.Fuzz(func(t *testing.T, src string) {
		var doc yaml.Node
		if yaml.Unmarshal([]byte(src), &doc) != nil {
			return
		}
		const limit = 2000
		err := CheckLimit(&doc, limit)
		var e *Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("error of another type: %v", err)
		}
		if err != nil && strings.Contains(e.Msg, "contains it") {
			return
		}
		if want := bruteForce(&doc, limit) > limit; (err != nil) != want {
			t.Fatalf("refused=%v (%v), expansion over the limit=%v", err != nil, err, want)
		}
	})
}
