package pipeline

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/operators"
)

const card = "4111-1111-1111-1111 CVV 123"

// exprFailure evaluates src on a record whose value is v and returns the
// runtime error.
func exprFailure(t *testing.T, src string, v map[string]any) (error, *operators.Record) {
	t.Helper()
	e, err := operators.CompileExpr(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &operators.Record{Value: v, Key: []byte("k-1")}
	_, err = e.Eval(rec)
	if err == nil {
		t.Fatalf("%s did not fail", src)
	}
	return err, rec
}

// TestScrubExprError is finding 12 at its source: an expression's runtime
// error renders the value it failed on; the shown text keeps the
// expression, its position and the kind of failure, not the value.
func TestScrubExprError(t *testing.T) {
	for _, c := range []struct{ src, keep string }{
		{"int(value.card)", "invalid operation: int(‹hidden›)"},
		{"value.card + 1", "invalid operation: string + int"},
		{"value.card.x", ""},
		{"float(value.card) > 2", ""},
		{"value.items[value.card]", ""},
	} {
		err, rec := exprFailure(t, c.src, map[string]any{"card": card, "items": []any{"a"}})
		full := err.Error()
		if c.src == "int(value.card)" && !strings.Contains(full, card) {
			t.Fatalf("the premise: expr's error carries the value; got %q", full)
		}
		r := &route{m: &Manager{}}
		shown := r.shownError(err, rec)
		for _, secret := range []string{"4111", "CVV", "123"} {
			if strings.Contains(shown, secret) {
				t.Errorf("%s: shown text %q carries %q (full: %q)", c.src, shown, secret, full)
			}
		}
		if !strings.Contains(shown, c.src) || !strings.Contains(shown, "(1:") || (shown != full) != strings.HasSuffix(shown, hiddenNote) {
			t.Errorf("%s: shown text %q lost the expression or its position, or the note", c.src, shown)
		}
		if c.keep != "" && !strings.Contains(shown, c.keep) {
			t.Errorf("%s: shown text %q lacks %q", c.src, shown, c.keep)
		}
		// With show_records, the full text.
		r.m.cfg.RecentValues = true
		if got := r.shownError(err, rec); got != full {
			t.Errorf("show_records: %q, want %q", got, full)
		}
	}
}

// TestScrubLeaves: values of the record are taken out of any error text
// (a decode error, a panic), words of a raw value too.
func TestScrubLeaves(t *testing.T) {
	rec := &operators.Record{Key: []byte("user-42"), Value: map[string]any{"n": 1234567.0, "s": []any{"Alice Secret", map[string]any{"deep": "hunter2"}}},
		Headers: []operators.Header{{Key: "h", Value: []byte("hdr-secret")}}}
	msg := "step panicked: map[n:1.234567e+06 s:[Alice Secret map[deep:hunter2]]] key user-42 header hdr-secret value 1234567"
	got := scrubText(msg, recordLeaves(rec))
	for _, s := range []string{"Alice", "hunter2", "user-42", "hdr-secret", "1234567", "1.234567e+06"} {
		if strings.Contains(got, s) {
			t.Errorf("%q kept %q", got, s)
		}
	}
	raw := &operators.Record{Raw: []byte(`{"card": "4111-1111-1111-1111", "cvv": "123"`)}
	got = scrubText(`decode: unexpected end of JSON input after "4111-1111-1111-1111" and 123`, recordLeaves(raw))
	if strings.Contains(got, "4111") || strings.Contains(got, "123") || !strings.HasPrefix(got, "decode: unexpected end of JSON input") {
		t.Errorf("raw record: %q", got)
	}
	// Nothing to hide: the text as it was, no note.
	if got := scrubText("write out[0]: MESSAGE_TOO_LARGE", recordLeaves(rec)); got != "write out[0]: MESSAGE_TOO_LARGE" {
		t.Errorf("clean text changed: %q", got)
	}
	// The work is bounded: a record of a million leaves.
	many := make([]any, 1_000_000)
	for i := range many {
		many[i] = fmt.Sprintf("value-%d", i)
	}
	if n := len(recordLeaves(&operators.Record{Value: map[string]any{"a": many}})); n != scrubMaxLeaves {
		t.Errorf("%d leaves, want the bound %d", n, scrubMaxLeaves)
	}
}

// FuzzScrubText: the scrub never panics, and a leaf of letters and digits
// (with a digit) never survives it.
func FuzzScrubText(f *testing.F) {
	f.Add("int(value.card): invalid operation: int(4111 CVV 123) (1:1)\n | int(value.card)\n | ^", "4111")
	f.Add("x: y (1:1)\n | \n | ^ (2:3)\n | z\n | .^", "a12")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, msg, leaf string) {
		got := scrubText(msg, []string{leaf})
		if len(got) > scrubMaxTextSize+len(hiddenNote)+len("…")+64*len(hiddenMark)*(1+len(msg)/max(1, len(leaf))) {
			t.Fatalf("output of %d bytes from %d", len(got), len(msg))
		}
		if len(leaf) < scrubMinLeaf || !strings.ContainsAny(leaf, "0123456789") {
			return
		}
		for _, r := range leaf {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
				return
			}
		}
		if strings.Contains(got, leaf) {
			t.Fatalf("scrubText(%q, %q) = %q keeps the leaf", msg, leaf, got)
		}
	})
}
