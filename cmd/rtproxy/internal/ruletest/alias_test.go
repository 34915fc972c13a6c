package ruletest

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// aliasBomb is a record value holding levels of `&aN [*aN-1 × width]`,
// indented under `value:`, and refs references to the last level.
func aliasBomb(levels, width, refs int) string {
	var b strings.Builder
	b.WriteString("tests:\n  - name: bomb\n    input:\n      - value:\n")
	b.WriteString("          a0: &a0 [x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= levels; i++ {
		r := make([]string, width)
		for j := range r {
			r[j] = fmt.Sprintf("*a%d", i-1)
		}
		fmt.Fprintf(&b, "          a%d: &a%d [%s]\n", i, i, strings.Join(r, ", "))
	}
	r := make([]string, refs)
	for j := range r {
		r[j] = fmt.Sprintf("*a%d", levels)
	}
	fmt.Fprintf(&b, "          v: [%s]\n    expect: {}\n", strings.Join(r, ", "))
	return b.String()
}

// Issue 25, finding 7: a 1.2 KB test file with nine levels of
// `&aN [*aN-1 ×9]` made `rtproxy test` grow to 24 GB. The test file is
// refused, at the alias that goes over the budget, before anything is
// expanded.
func TestAliasBombRefused(t *testing.T) {
	for _, c := range []struct {
		levels, width, refs int
		line                int
	}{
		// 1.9M nodes: small enough to expand without the budget (the
		// test fails, it does not crash, where there is none).
		{5, 9, 2, 11},
		// The finding's file.
		{9, 9, 1, 11},
	} {
		src := aliasBomb(c.levels, c.width, c.refs)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f, err := Parse("bomb.test.yaml", []byte(src))
		runtime.ReadMemStats(&after)
		var errs Errors
		if !errors.As(err, &errs) || len(errs) != 1 {
			t.Fatalf("%d levels of %d: parsed (%v, %d tests), want the alias budget to refuse it", c.levels, c.width, err, len(testsOf(f)))
		}
		e := errs[0]
		if e.Line != c.line || !strings.Contains(e.Msg, "aliases here expand to more than") {
			t.Errorf("%d levels: error %+v, want it at line %d naming the alias budget", c.levels, e, c.line)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
			t.Errorf("%d levels: parsing allocated %d bytes", c.levels, grew)
		}
	}
	// Aliases that repeat a little still work.
	ok := "tests:\n  - name: reuse\n    input:\n      - value: &v {a: 1, b: [1, 2]}\n      - value: *v\n    expect: {}\n"
	if _, err := Parse("ok.test.yaml", []byte(ok)); err != nil {
		t.Fatal(err)
	}
}

func testsOf(f *File) []*Test {
	if f == nil {
		return nil
	}
	return f.Tests
}
