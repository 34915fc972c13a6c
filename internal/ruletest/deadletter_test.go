package ruletest

import (
	"strings"
	"testing"
)

// TestDeadLetterValueAndTimestamp pins what docs/RULES.md (the
// dead_letter key) says a dead letter carries: the value as it arrived,
// whatever steps before the failure did; past a repartition, the value as
// the steps before it wrote it; and the source record's timestamp, not the
// test clock's.
func TestDeadLetterValueAndTimestamp(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"dl.yaml": `route: dl
source: { topic: in }
sink: { topic: out }
steps:
  - set: { tag: '"set"' }
  - set: { n: int(value.first) }
  - drop_duplicates: { key: value.id }
  - set: { m: int(value.second) }
`,
		"dl.test.yaml": `tests:
  - name: before and past the repartition
    input:
      - { key: a, value: '{"id":1,"first":"x","second":"2"}', timestamp: 1700000000000 }
      - { key: b, value: '{"id":2,"first":"1","second":"y"}', timestamp: 1700000001000 }
    expect:
      sink: []
      dead_letters:
        - { key: a, value: '{"id":1,"first":"x","second":"2"}', step: "1:set", timestamp: 1700000000000 }
        - { key: b, value: { id: 2, first: "1", second: "y", tag: set, n: 1 }, step: "3:set", timestamp: 1700000001000 }
`,
	})
	code, out := run(t, Options{Verbose: true}, dir)
	if code != ExitPass || !strings.Contains(out, "--- PASS: dl/before and past the repartition") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
