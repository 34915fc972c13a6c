package ruletest

import (
	"strings"
	"testing"
)

const maskView = `view: payments.for-analytics
topic: payments
hash_salt_file: salt
steps:
  - filter: value.status != "test"
  - set:
      card: mask(value.card, 4)
  - drop: [email]
`

const inPlace = `view: payments
topic: payments
clients: { client_id: ["bi-*"] }
steps:
  - drop: [card]
`

// TestViewTests: a view's test file gives stored records and states what
// a client fetches: filtered records absent (their offsets gaps), masked
// values, the placeholder of a record the view cannot process; a client
// the view does not name fetches the originals.
func TestViewTests(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"salt":           "a-salt-of-enough-bytes\n",
		"analytics.yaml": maskView,
		"analytics.test.yaml": `view: payments.for-analytics
tests:
  - name: masks and filters
    input:
      - {key: p1, value: {status: ok, card: "4111111111111111", email: a@b.c, amount: 5}}
      - {key: p2, value: {status: test, card: "1"}}
      - {key: p3, value: "not json"}
      - {key: p4, value: null}
    expect:
      records:
        - {key: p1, offset: 0, value: {status: ok, card: "************1111", amount: 5}}
        - {key: p3, offset: 2, value: null, error: "not valid JSON"}
        - {key: p4, offset: 3, value: null}
`,
		"inplace.yaml": inPlace,
		"inplace.test.yaml": `view: payments
tests:
  - name: a named client
    client: {client_id: bi-daily}
    input:
      - {value: {id: 1, card: "4111"}}
    expect:
      records:
        - {value: {id: 1}}
  - name: another client gets the originals
    client: {client_id: payments-service}
    input:
      - {value: {id: 1, card: "4111"}}
    expect:
      records:
        - {value: {id: 1, card: "4111"}}
`,
	})
	code, out := run(t, Options{Verbose: true}, dir)
	if code != ExitPass {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{"--- PASS: payments.for-analytics/masks and filters", "--- PASS: payments/a named client", "--- PASS: payments/another client gets the originals"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// TestViewTestFailures: a wrong expectation of a view test says which
// record and field differ, with the file's line.
func TestViewTestFailures(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"salt":           "a-salt-of-enough-bytes\n",
		"analytics.yaml": maskView,
		"analytics.test.yaml": `tests:
  - name: wrong
    input:
      - {value: {status: test}}
      - {value: {status: ok, card: "12345"}}
      - {value: "{"}
    expect:
      records:
        - {offset: 0, value: {status: ok, card: "*2345"}}
        - {value: null, error: "budget"}
  - name: sink is for routes
    input:
      - {value: {status: ok}}
    expect:
      sink: []
`,
		"route.yaml":      "route: r\nsource: { topic: a }\nsink: { topic: b }\n",
		"route.test.yaml": "tests:\n  - name: c\n    client: {client_id: x}\n    input: [{value: {}}]\n    expect: {sink: [{value: {}}]}\n  - name: r\n    input: [{value: {}}]\n    expect: {records: []}\n",
		"other.yaml":      inPlace,
		"other.test.yaml": "route: payments\ntests:\n  - name: x\n    input: [{value: {}}]\n    expect: {records: []}\n",
	})
	code, out := run(t, Options{}, dir)
	if code != ExitFail {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"analytics.test.yaml:10: records record 2 differs:",
		`error: want it to contain "budget", got "the value is not valid JSON"`,
		`(the client is not told: "value is not valid JSON: want a string object key at offset 1")`,
		"analytics.test.yaml:9: records record 1 is at offset 1, want offset 0 (a record the view filters out leaves a gap)",
		"a view writes no sink and no dead letters: expect `records:`",
		`the test file is for route "payments", but `,
		`holds view "payments"`,
		"route.test.yaml:3: `client:` says who fetches a view; route \"r\" is not a view",
		"route.test.yaml:8: expect.records is what a view's client fetches",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
