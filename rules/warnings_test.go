package rules

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckWarnsOnUnboundedConstructs: `rtproxy check` accepts a rule whose
// state or work per record can grow without bound, and says so where it
// can tell, at the construct's place in the file (issue 10).
func TestCheckWarnsOnUnboundedConstructs(t *testing.T) {
	for _, tc := range []struct {
		name, steps string
		want        []string
	}{
		{"drop_duplicates without ttl", "  - drop_duplicates: { key: value.id }\n",
			[]string{"warning: r.yaml:7:5: drop_duplicates without `ttl` remembers every key for good: its state grows with each new key and is never trimmed; give it a `ttl` (e.g. `ttl: 24h`) unless the keys are few (near `drop_duplicates`)"}},
		{"drop_duplicates with ttl", "  - drop_duplicates: { key: value.id, ttl: 1h }\n", nil},
		{"a sliding window of many windows per record", "  - window: { kind: sliding, size: 1h, slide: 1s, aggregate: { n: count() } }\n",
			[]string{"warning: r.yaml:7:47: every record updates 3600 windows (size / slide), and the open windows per key are as many: a larger slide costs less (near `1s`)"}},
		{"count_distinct over a day", "  - window: { kind: tumbling, size: 24h, key: value.page, aggregate: { n: count(), users: count_distinct(value.user) } }\n",
			[]string{"warning: r.yaml:7:84: count_distinct is exact: it keeps every distinct value of an open window, for 24h0m0s here; a value with many distinct values grows the state with them (near `users`)"}},
		{"count_distinct over a minute", "  - window: { kind: tumbling, size: 1m, aggregate: { users: count_distinct(value.user) } }\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"r.yaml": base + "steps:\n" + tc.steps})
			var out bytes.Buffer
			if !CheckPaths(&out, []string{filepath.Join(dir, "r.yaml")}) {
				t.Fatalf("refused:\n%s", out.String())
			}
			lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(out.String(), dir+string(filepath.Separator), "")), "\n")
			if lines[0] != "ok r.yaml" {
				t.Errorf("first line %q, want ok r.yaml", lines[0])
			}
			if got := strings.Join(lines[1:], "\n"); got != strings.Join(tc.want, "\n") {
				t.Errorf("warnings:\n got: %s\nwant: %s", got, strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestConditionThatIsNeverBool: `filter: value.x + 1` can never be true or
// false, whatever the record holds; the check refuses it instead of
// dead-lettering every record at run time (issue 14).
func TestConditionThatIsNeverBool(t *testing.T) {
	for _, tc := range []struct{ filter, want string }{
		{"value.x + 1", "r.yaml:7:13: filter must be true or false, but `value.x + 1` always gives a number or a string; write a condition such as `value.amount > 0` (near `value.x + 1`)"},
		{`value.a * 2`, "r.yaml:7:13: filter must be true or false, but `value.a * 2` always gives a number; write a condition such as `value.amount > 0` (near `value.a * 2`)"},
		{`"yes"`, "r.yaml:7:13: filter must be true or false, but `\"yes\"` always gives a string; write a condition such as `value.amount > 0` (near `\"yes\"`)"},
		{`1..3`, "r.yaml:7:13: filter must be true or false, but `1..3` always gives a list; write a condition such as `value.amount > 0` (near `1..3`)"},
		{`value.x + 1 > 2`, ""},
		{`value.ok`, ""},
		{`value.a ? true : false`, ""},
	} {
		got := loadErrors(t, map[string]string{"r.yaml": base + "steps:\n  - filter: '" + strings.ReplaceAll(tc.filter, "'", "''") + "'\n"})
		if strings.Join(got, "\n") != tc.want {
			t.Errorf("filter %s:\n got: %s\nwant: %s", tc.filter, strings.Join(got, "\n"), tc.want)
		}
	}
}
