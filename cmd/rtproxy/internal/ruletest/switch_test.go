package ruletest

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/rules"
)

const switchRoute = `route: by-size
source: { topic: payments }
steps:
  - switch:
      - when: value.amount > 1000
        sink: { topic: payments.large, key: value.account }
      - when: value.currency != "EUR"
        sink: { topic: payments.foreign }
      - sink: { topic: payments.rest, format: avro, subject: rest-value }
`

// TestSwitchSinks: `rtproxy test` expects records per sink of a switch
// (expect.sinks), checks each sink's key, says which sink got a record
// that was expected elsewhere, and refuses expect.sink and unknown sinks.
// A condition that fails makes the record a dead letter.
func TestSwitchSinks(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"by-size.yaml": switchRoute,
		"by-size.test.yaml": `tests:
  - name: each record in its sink
    input:
      - {key: k1, value: {amount: 5000, currency: EUR, account: a1}}
      - {key: k2, value: {amount: 10, currency: USD, account: a2}}
      - {key: k3, value: {amount: 20, currency: EUR, account: a3}}
      - {key: k4, value: {amount: 2000, currency: USD, account: a4}}
      - {key: k5, value: {amount: "x", currency: EUR}}
    expect:
      sinks:
        payments.large:
          - {key: a1, value: {amount: 5000, currency: EUR, account: a1}}
          - {key: a4, value: {amount: 2000, currency: USD, account: a4}}
        payments.foreign:
          - {key: k2, value: {amount: 10, currency: USD, account: a2}}
        payments.rest:
          - {key: k3, value: {amount: 20, currency: EUR, account: a3}}
      dead_letters:
        - {key: k5, reason: error, step: "0:switch", error: "switch branch 1 (payments.large)"}
`})
	code, out := run(t, Options{Verbose: true}, dir)
	if code != ExitPass {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	writeFiles(t, dir, map[string]string{"by-size.test.yaml": `tests:
  - name: wrong sink
    input:
      - {key: k2, value: {amount: 10, currency: USD}}
    expect:
      sinks:
        payments.rest:
          - {key: k2, value: {amount: 10, currency: USD}}
  - name: one sink expected
    input:
      - {key: k3, value: {amount: 20, currency: EUR}}
    expect:
      sink:
        - {key: k3, value: {amount: 20, currency: EUR}}
  - name: unknown sink
    input:
      - {key: k3, value: {amount: 20, currency: EUR}}
    expect:
      sinks:
        payments.rest:
          - {key: k3, value: {amount: 20, currency: EUR}}
        payments.small: []
`})
	code, out = run(t, Options{}, dir)
	if code != ExitFail {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	tf := filepath.Join(dir, "by-size.test.yaml")
	for _, want := range []string{
		tf + ":8: sinks.payments.rest record 1 was expected but not written:",
		"expect.sinks.payments.foreign is not given, so none are expected, but the route wrote 1:",
		`route "by-size" writes to 3 sinks (its switch): give what each receives under ` + "`expect.sinks`, by sink (payments.large, payments.foreign, payments.rest)",
		`expect.sinks names "payments.small", which is no sink of route "by-size"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestSwitchAfterWindowAndHTTPBranch: a switch routes a window's rows, and
// an HTTP branch's outputs are expected under its name (http-<branch>),
// never its URL; a record no branch takes is in no sink.
func TestSwitchAfterWindowAndHTTPBranch(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"rows.yaml": `route: rows
source: { topic: clicks, event_time: value.ts }
steps:
  - window: { kind: tumbling, size: 10s, key: value.page, aggregate: { n: count() }, emit: on_close }
  - switch:
      - when: value.n >= 2
        sink: { topic: pages.busy }
      - when: value.n == 1
        sink: { http: { url: "http://hooks.internal:8080/quiet" } }
`,
		"rows.test.yaml": `tests:
  - name: rows by count
    input:
      - {value: {page: /a, ts: 1000}}
      - {value: {page: /a, ts: 2000}}
      - {value: {page: /b, ts: 3000}}
      - advance: {watermark: 10000}
    expect:
      order: any
      sinks:
        pages.busy:
          - {key: /a, value: {key: /a, n: 2, window_start: 0, window_end: 10000}}
        http-2:
          - {key: /b, value: {key: /b, n: 1, window_start: 0, window_end: 10000}}
`})
	o := Options{Verbose: true, Rules: rules.Options{Allow: &rules.Allow{URLs: []string{"http://hooks.internal:8080"}}}}
	if code, out := run(t, o, dir); code != ExitPass {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
