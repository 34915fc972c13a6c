package ruletest

import (
	"strings"
	"testing"
)

const streamJoinRule = `route: sj
source: { topic: payments, event_time: value.ts }
sink: { topic: out }
steps:
  - join:
      stream: { topic: auths, event_time: value.ts }
      on: value.auth_id
      other: value.id
      within: { before: 1m }
      grace: 0s
      kind: outer
      as: auth
  - map:
      p: value?.id
      a: auth?.id
`

// TestStreamTopicInputs: input records name the stream join's topic with
// `topic:`, on any partition; an outer join emits the authorization that
// matched nothing with a null payment; a topic the route does not read
// fails the test at its line, naming the topics it reads.
func TestStreamTopicInputs(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"sj.yaml": streamJoinRule,
		"sj.test.yaml": `tests:
  - name: both topics
    partitions: 2
    input:
      - {topic: auths, partition: 1, value: {id: a1, ts: 1000}}
      - {topic: auths, value: {id: a9, ts: 1000}}
      - {topic: payments, key: p1, value: {id: p1, auth_id: a1, ts: 30000}}
      - advance: {watermark: 200000}
    expect:
      order: any
      sink:
        - {key: p1, value: {p: p1, a: a1}}
        - {value: {p: null, a: a9}}
  - name: unknown topic
    input:
      - {topic: nope, value: {id: a1, ts: 1000}}
    expect:
      sink: []
`})
	code, out := run(t, Options{Verbose: true}, dir)
	if code != ExitFail {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	if !strings.Contains(out, "--- PASS: sj/both topics") {
		t.Errorf("the test of both topics did not pass:\n%s", out)
	}
	if !strings.Contains(out, "sj.test.yaml:16: input record: topic nope: the route reads payments (its source) and auths") {
		t.Errorf("no clear failure for the unknown topic:\n%s", out)
	}
}

// TestStreamTopicInputsRegistryFormats: a stream join whose second topic
// is Avro or Protobuf takes its input records as the tree they decode
// into, as a source of those formats does: the rows are the JSON
// stream's, no registry needed.
func TestStreamTopicInputsRegistryFormats(t *testing.T) {
	for _, format := range []string{"avro", "protobuf"} {
		t.Run(format, func(t *testing.T) {
			rule := strings.Replace(streamJoinRule, "event_time: value.ts }\n      on:", "event_time: value.ts, format: "+format+" }\n      on:", 1)
			if !strings.Contains(rule, "format: "+format) {
				t.Fatal("the rule does not read the stream as " + format)
			}
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{
				"sj.yaml": rule,
				"sj.test.yaml": `tests:
  - name: both topics
    partitions: 2
    input:
      - {topic: auths, partition: 1, value: {id: a1, ts: 1000}}
      - {topic: auths, value: {id: a9, ts: 1000}}
      - {topic: payments, key: p1, value: {id: p1, auth_id: a1, ts: 30000}}
      - advance: {watermark: 200000}
    expect:
      order: any
      sink:
        - {key: p1, value: {p: p1, a: a1}}
        - {value: {p: null, a: a9}}
`})
			code, out := run(t, Options{Verbose: true}, dir)
			if code != ExitPass || !strings.Contains(out, "--- PASS: sj/both topics") {
				t.Fatalf("exit %d, want 0:\n%s", code, out)
			}
		})
	}
}
