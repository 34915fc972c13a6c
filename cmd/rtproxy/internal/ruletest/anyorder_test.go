package ruletest

import (
	"strings"
	"testing"
)

const amounts = `route: amounts
source: { topic: in }
sink: { topic: out }
steps:
  - set:
      amount: value.amount * 2
`

// TestOrderAnyFieldDiff: with order: any, an expected record that no
// written one matches is shown against the nearest written one, field by
// field, as strict order shows it against its counterpart.
func TestOrderAnyFieldDiff(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"amounts.yaml": amounts, "amounts.test.yaml": `tests:
  - name: doubled
    input:
      - { key: a, value: { id: 1, amount: 5, note: x } }
      - { key: b, value: { id: 2, amount: 7, note: y } }
      - { key: c, value: { id: 3, amount: 9, note: z } }
    expect:
      order: any
      sink:
        - { key: c, value: { id: 3, amount: 18, note: z } }
        - { key: b, value: { id: 2, amount: 15, note: y } }
        - { key: a, value: { id: 1, amount: 10, note: x } }
`})
	code, out := run(t, Options{}, dir)
	if code != ExitFail {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"amounts.test.yaml:11: no written sink record matches this expected one (order: any); the nearest, written 2, differs:",
		"value.amount: want 15, got 14",
		`want: {key: "b", value: {"amount":15,"id":2,"note":"y"}}`,
		`got:  {key: "b", value: {"amount":14,"id":2,"note":"y"}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	// The nearest record is explained once, not again as unexpected.
	if strings.Contains(out, "matches no expected one") {
		t.Errorf("the nearest record is reported twice:\n%s", out)
	}
}

// TestOrderAnyMatching: a loose expectation does not take the only written
// record a stricter one fits (the match is a bipartite matching, not
// first come first served).
func TestOrderAnyMatching(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"amounts.yaml": amounts, "amounts.test.yaml": `tests:
  - name: loose first
    input:
      - { key: a, value: { id: 1, amount: 5 } }
      - { key: b, value: { id: 2, amount: 7 } }
    expect:
      order: any
      sink:
        - { }
        - { key: a }
`})
	if code, out := run(t, Options{}, dir); code != ExitPass {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
