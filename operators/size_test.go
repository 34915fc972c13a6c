package operators

import (
	"testing"

	"github.com/expr-lang/expr"
)

// `size` is the number of bytes of the record's value as produced: Raw,
// whatever Value has become since.
func TestSizeIsTheValueBytes(t *testing.T) {
	size, err := CompileExpr("size", nil)
	if err != nil {
		t.Fatal(err)
	}
	cond, err := CompileExpr("size > 3 && size <= 10240", nil, expr.AsBool())
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{}
	if err := r.SetJSON([]byte(`{"a": 1}`)); err != nil {
		t.Fatal(err)
	}
	if v, err := size.Eval(r); err != nil || v != int64(8) {
		t.Fatalf("size = %v (%T), %v; want int64 8", v, v, err)
	}
	if v, _ := cond.Eval(r); v != true {
		t.Fatalf("size > 3 && size <= 10240 = %v", v)
	}
	// A step that replaces the value does not change it.
	r.Value = map[string]any{"b": "a longer value than before"}
	if v, _ := size.Eval(r); v != int64(8) {
		t.Fatalf("after a map, size = %v, want 8", v)
	}
	// A null value, and a record built without bytes (a window row).
	if v, _ := size.Eval(&Record{Value: map[string]any{"n": 1.0}}); v != int64(0) {
		t.Fatalf("size without Raw = %v, want 0", v)
	}
	if got := Env(r)["size"]; got != int64(8) {
		t.Fatalf("Env size = %v", got)
	}
}
