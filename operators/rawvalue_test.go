package operators

import (
	"bytes"
	"testing"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

func TestValueBytes(t *testing.T) {
	raw := []byte(`{"b":1, "a":"x", "amount": 5}`)
	fresh := func(t *testing.T) *Record {
		r := &Record{}
		if err := r.SetJSON(raw); err != nil {
			t.Fatal(err)
		}
		if b, ok := r.ValueBytes(); !ok || !bytes.Equal(b, raw) {
			t.Fatalf("right after SetJSON: %q, %v", b, ok)
		}
		return r
	}
	run := func(r *Record, steps ...Step) *recorder {
		out := &recorder{}
		(&chain{steps: steps, next: out}).run(r)
		return out
	}
	expr := func(src string) *Expr {
		e, err := CompileExpr(src, []string{"m"})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	table := NewMapTable()
	table.Set("x", map[string]any{"name": "X"})

	t.Run("filter and join keep Raw", func(t *testing.T) {
		r := fresh(t)
		out := run(r, NewFilter(expr(`value.amount > 1`)), NewJoin(table, expr("value.a"), "m", MissingDrop))
		if len(out.emitted) != 1 {
			t.Fatalf("emitted %d", len(out.emitted))
		}
		if b, ok := out.emitted[0].ValueBytes(); !ok || !bytes.Equal(b, raw) {
			t.Fatalf("after filter+join: %q, %v", b, ok)
		}
	})
	t.Run("set changes the value in place", func(t *testing.T) {
		r := fresh(t)
		run(r, NewSet([]Field{{Name: "c", Expr: expr("2")}}))
		if b, ok := r.ValueBytes(); ok {
			t.Fatalf("after set: %q", b)
		}
		if out, _ := jsoncodec.Append(nil, r.Value); string(out) != `{"a":"x","amount":5,"b":1,"c":2}` {
			t.Fatalf("value %s", out)
		}
	})
	t.Run("map replaces the value", func(t *testing.T) {
		r := fresh(t)
		run(r, NewMap([]Field{{Name: "a", Expr: expr("value.a")}}))
		if _, ok := r.ValueBytes(); ok {
			t.Fatal("after map: Raw still offered")
		}
	})
	t.Run("assigning Value or Raw", func(t *testing.T) {
		r := fresh(t)
		r.Value = map[string]any{"b": 1.0, "a": "x", "amount": 5.0} // equal, but another object
		if _, ok := r.ValueBytes(); ok {
			t.Fatal("after a new Value: Raw still offered")
		}
		r = fresh(t)
		r.Raw = bytes.Clone(raw)
		if _, ok := r.ValueBytes(); ok {
			t.Fatal("after a new Raw: Raw still offered")
		}
		r = fresh(t)
		r.ValueChanged()
		if _, ok := r.ValueBytes(); ok {
			t.Fatal("after ValueChanged: Raw still offered")
		}
		r = fresh(t)
		r.ResetEnv()
		if _, ok := r.ValueBytes(); ok {
			t.Fatal("after ResetEnv: Raw still offered")
		}
	})
	t.Run("scalars and errors", func(t *testing.T) {
		for _, s := range []string{`null`, `"s"`, ` 1.5 `, `true`, `[]`, `[1,{"a":2}]`} {
			r := &Record{}
			if err := r.SetJSON([]byte(s)); err != nil {
				t.Fatal(err)
			}
			if b, ok := r.ValueBytes(); !ok || string(b) != s {
				t.Fatalf("%s: %q, %v", s, b, ok)
			}
		}
		r := &Record{Raw: []byte("old"), Value: "old"}
		if err := r.SetJSON([]byte(`{"a":`)); err == nil || err.Error() != "decode json: unexpected end of JSON input at offset 5" {
			t.Fatalf("error %v", err)
		}
		if string(r.Raw) != "old" || r.Value != "old" {
			t.Fatalf("failed SetJSON changed the record: %q %v", r.Raw, r.Value)
		}
		if _, ok := r.ValueBytes(); ok {
			t.Fatal("a record never set by SetJSON offers Raw")
		}
	})
}

// recorder keeps what a chain emits and dead-letters.
type recorder struct {
	emitted []*Record
	dead    []Reason
}

func (o *recorder) Emit(r *Record)                               { o.emitted = append(o.emitted, r) }
func (o *recorder) DeadLetter(_ *Record, reason Reason, _ error) { o.dead = append(o.dead, reason) }
