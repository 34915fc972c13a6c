package operators

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// maskReference is mask written the obvious way: the characters as range
// reads them (an invalid byte is one), each hidden one a '*', the kept
// ones as their bytes were.
func maskReference(s string, keep int) string {
	var starts []int
	for i := range s {
		starts = append(starts, i)
	}
	hide := len(starts) - keep
	if len(starts) <= keep {
		hide = len(starts)
	}
	if hide == len(starts) {
		return strings.Repeat("*", hide)
	}
	return strings.Repeat("*", hide) + s[starts[hide]:]
}

func evalOn(t *testing.T, src string, value any, key []byte) (any, error) {
	t.Helper()
	e, err := CompileExpr(src, nil)
	if err != nil {
		t.Fatalf("compile %s: %v", src, err)
	}
	r := &Record{Value: value, HashKey: key}
	return e.Eval(r)
}

func TestMask(t *testing.T) {
	cases := []struct {
		src   string
		value any
		want  any
	}{
		{`mask(value.card, 4)`, map[string]any{"card": "4111111111111111"}, "************1111"},
		{`mask(value.card, 0)`, map[string]any{"card": "abc"}, "***"},
		{`mask(value.card, 4)`, map[string]any{"card": "1234"}, "****"}, // no longer than kept: hidden whole
		{`mask(value.card, 4)`, map[string]any{"card": "12"}, "**"},
		{`mask(value.card, 2)`, map[string]any{"card": "ÄÖÜxy"}, "***xy"}, // characters, not bytes
		{`mask(value.card, 2)`, map[string]any{"card": 4111.0}, "**11"},   // a number: its text
		{`mask(value.card, 4)`, map[string]any{"card": nil}, nil},
		{`mask(value.missing, 4)`, map[string]any{}, nil},
		{`mask(value.card, 4)`, map[string]any{"card": ""}, ""},
	}
	for _, c := range cases {
		got, err := evalOn(t, c.src, c.value, nil)
		if err != nil || got != c.want {
			t.Errorf("%s on %v = %#v, %v; want %#v", c.src, c.value, got, err, c.want)
		}
	}
	if _, err := CompileExpr(`mask(value.card, "4")`, nil); err == nil {
		t.Error(`mask(value.card, "4") compiled; keep_last must be a whole number`)
	}
	for _, bad := range []struct{ src, msg string }{
		{`mask(value.card, -1)`, "keep_last is -1"},
		{`mask(value.card, value.keep)`, "keep_last is string"},
		{`mask(value, 4)`, "not a string or number"},
	} {
		_, err := evalOn(t, bad.src, map[string]any{"card": "x", "keep": "4"}, nil)
		if err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("%s: err %v, want one saying %q", bad.src, err, bad.msg)
		}
	}
}

func TestHash(t *testing.T) {
	key := []byte("a salt of sixteen or more bytes")
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("ann@example.com"))
	want := hex.EncodeToString(mac.Sum(nil))
	got, err := evalOn(t, `hash(value.email)`, map[string]any{"email": "ann@example.com"}, key)
	if err != nil || got != want {
		t.Fatalf("hash = %v, %v; want %s", got, err, want)
	}
	other, _ := evalOn(t, `hash(value.email)`, map[string]any{"email": "ann@example.com"}, []byte("another salt, as long as needed"))
	if other == got {
		t.Fatal("two salts gave one hash")
	}
	if n, _ := evalOn(t, `hash(value.n)`, map[string]any{"n": 42.0}, key); n != HashString(key, "42") {
		t.Fatalf("hash(42) = %v, want the hash of \"42\"", n)
	}
	if n, err := evalOn(t, `hash(value.none)`, map[string]any{}, key); n != nil || err != nil {
		t.Fatalf("hash(nil) = %v, %v; want nil", n, err)
	}
	if _, err := evalOn(t, `hash(value.email)`, map[string]any{"email": "x"}, nil); !errors.Is(err, errNoSalt) && (err == nil || !strings.Contains(err.Error(), "no salt")) {
		t.Fatalf("hash without a salt: err %v, want no salt", err)
	}
	e, _ := CompileExpr(`hash(value.email) + "x"`, nil)
	if !e.UsesHash() {
		t.Fatal("UsesHash false for an expression calling hash")
	}
	if e, _ := CompileExpr(`mask(value.email, 2)`, nil); e.UsesHash() {
		t.Fatal("UsesHash true for an expression without hash")
	}
}

// TestHelpersBudgeted: mask and hash charge the evaluation's budget, so a
// huge value trips limits.expr_memory_bytes instead of allocating.
func TestHelpersBudgeted(t *testing.T) {
	old := limits.Load()
	defer limits.Store(old)
	SetLimits(Limits{ExprBytes: 1 << 10, ExprSteps: 1 << 20, ExprTime: old.ExprTime})
	big := strings.Repeat("x", 4<<10)
	_, err := evalOn(t, `mask(value.s, 4)`, map[string]any{"s": big}, nil)
	if err == nil || !strings.Contains(err.Error(), "limits.expr_memory_bytes") {
		t.Fatalf("mask of 4 KiB under a 1 KiB budget: err %v", err)
	}
	if got, err := evalOn(t, `mask(value.s, 4)`, map[string]any{"s": big[:100]}, nil); err != nil || len(got.(string)) != 100 {
		t.Fatalf("mask of 100 bytes under a 1 KiB budget: %v", err)
	}
	SetLimits(Limits{ExprBytes: 1 << 20, ExprSteps: 10, ExprTime: old.ExprTime})
	if _, err := evalOn(t, `mask(value.s, 4)`, map[string]any{"s": big}, nil); err == nil || !strings.Contains(err.Error(), "limits.expr_steps") {
		t.Fatalf("mask of 4096 characters in 10 steps: err %v", err)
	}
}

func FuzzMask(f *testing.F) {
	for _, s := range []string{"", "a", "4111111111111111", "ÄÖÜ€x", "\xff\xfe", "日本語テキスト"} {
		f.Add(s, 0)
		f.Add(s, 4)
	}
	f.Fuzz(func(t *testing.T, s string, keep int) {
		if keep < 0 || keep > 1<<12 {
			return
		}
		got, err := mask(nil, s, keep)
		if err != nil {
			t.Fatalf("mask(%q, %d): %v", s, keep, err)
		}
		want := maskReference(s, keep)
		if got != want {
			t.Fatalf("mask(%q, %d) = %q, want %q", s, keep, got, want)
		}
		g := got.(string)
		if len(g) > len(s) || utf8.RuneCountInString(g) != utf8.RuneCountInString(s) || !strings.HasSuffix(s, strings.TrimLeft(g, "*")) {
			t.Fatalf("mask(%q, %d) = %q: longer, or not one character per character", s, keep, g)
		}
		// Nothing but the kept tail is shown.
		if n := utf8.RuneCountInString(s); n <= keep && strings.Trim(g, "*") != "" {
			t.Fatalf("mask(%q, %d) = %q shows a value no longer than what is kept", s, keep, g)
		}
	})
}

func TestBudgetOf(t *testing.T) {
	if got := BudgetOf(fmt.Errorf("wrapped: %w", &budgetError{budget: BudgetExprSteps})); got != BudgetExprSteps {
		t.Fatalf("BudgetOf = %q", got)
	}
	if got := BudgetOf(errors.New("plain")); got != "" {
		t.Fatalf("BudgetOf(plain) = %q", got)
	}
}
