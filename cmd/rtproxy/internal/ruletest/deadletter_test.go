package ruletest

import (
	"strings"
	"testing"
)

// TestDeadLetterValueAndTimestamp pins what docs/RULES.md (the
// dead_letter key) says a dead letter carries: the value as it was when it
// failed (the source bytes while no step changed the value, else the value
// as the steps left it, as JSON; past a repartition, with the changes
// after it too), and the source record's timestamp, not the test clock's.
func TestDeadLetterValueAndTimestamp(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"dl.yaml": `route: dl
source: { topic: in }
sink: { topic: out }
steps:
  - filter: value.id > 0
  - set: { n: int(value.first) }
  - set: { k: int(value.third) }
  - drop_duplicates: { key: value.id }
  - set: { m: int(value.second) }
`,
		"dl.test.yaml": `tests:
  - name: where each record failed
    input:
      - { key: a, value: '{"id":1,"first":"x","second":"2","third":"3"}', timestamp: 1700000000000 }
      - { key: c, value: '{"id":3,"first":"5","second":"2","third":"w"}', timestamp: 1700000002000 }
      - { key: b, value: '{"id":2,"first":"1","second":"y","third":"3"}', timestamp: 1700000001000 }
    expect:
      sink: []
      dead_letters:
        # no step changed it: the bytes it came with
        - { key: a, value: '{"id":1,"first":"x","second":"2","third":"3"}', step: "1:set", timestamp: 1700000000000 }
        # a set changed it before the failure: that value, as JSON
        - { key: c, value: { id: 3, first: "5", second: "2", third: w, n: 5 }, step: "2:set", timestamp: 1700000002000 }
        # past the repartition: what the steps before it wrote
        - { key: b, value: { id: 2, first: "1", second: "y", third: "3", n: 1, k: 3 }, step: "4:set", timestamp: 1700000001000 }
`,
	})
	code, out := run(t, Options{Verbose: true}, dir)
	if code != ExitPass || !strings.Contains(out, "--- PASS: dl/where each record failed") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
