package rules

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 25, finding 9: `rtproxy check` warned about a sliding window's
// windows per record, but not multiplied by the `explode` before it: 10k
// items into a window sliding by 1 ms passed without a word and ran out of
// memory. The check multiplies the fan-out along the steps.
func TestCheckWarnsOnFanOut(t *testing.T) {
	for _, tc := range []struct {
		name, steps string
		want        string // a fragment of the one warning, "" for none
	}{
		{"explode into a sliding window of 1 ms",
			"  - explode: { each: value.items, as: item }\n  - window: { kind: sliding, size: 10s, slide: 1ms, key: item, aggregate: { n: count() } }\n",
			"r.yaml:8:5: after `explode` at line 7 (up to 10000 each), this window can make up to 10000 window updates of each record it gets: up to 100000000 per source record, more than the fan-out budget of 100000 (limits.max_fanout)"},
		{"two explodes",
			"  - explode: { each: value.a, as: x }\n  - explode: { each: value.b, as: y }\n",
			"r.yaml:8:5: after `explode` at line 7 (up to 10000 each), this explode can make up to 10000 records of each record it gets: up to 100000000 per source record"},
		{"explode into a tumbling window", "  - explode: { each: value.items, as: item }\n  - window: { kind: tumbling, size: 1m, aggregate: { n: count() } }\n", ""},
		{"one explode", "  - explode: { each: value.items, as: item }\n  - filter: item > 1\n", ""},
		{"explode after a window that emits on close",
			"  - window: { kind: sliding, size: 10s, slide: 1s, aggregate: { n: count() } }\n  - explode: { each: '[1, 2]', as: x }\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"r.yaml": base + "steps:\n" + tc.steps})
			var out bytes.Buffer
			if !CheckPaths(&out, []string{filepath.Join(dir, "r.yaml")}) {
				t.Fatalf("refused:\n%s", out.String())
			}
			var fan []string
			for _, l := range strings.Split(strings.ReplaceAll(out.String(), dir+string(filepath.Separator), ""), "\n") {
				if strings.Contains(l, "fan-out") || strings.Contains(l, "after `") {
					fan = append(fan, l)
				}
			}
			switch {
			case tc.want == "" && len(fan) > 0:
				t.Errorf("unexpected warning %q", fan)
			case tc.want != "" && (len(fan) != 1 || !strings.Contains(fan[0], tc.want)):
				t.Errorf("warnings %q, want one with %q", fan, tc.want)
			}
		})
	}
}
