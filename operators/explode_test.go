package operators

import (
	"bytes"
	"testing"
)

// TestExplodeCopiesAreIndependent: each copy has its own value object, so a
// `set` after the explode changes one copy only; a copy whose value is
// still the record's decoded bytes goes out as those bytes, and one that a
// step changed does not.
func TestExplodeCopiesAreIndependent(t *testing.T) {
	st, err := buildStep("explode: { each: value.items, as: item }", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	set, err := buildStep("set: { item: item }", []string{"item"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := []byte(`{"id":7,"items":["a","b"]}`)
	in := &Record{Topic: "in", Key: []byte("k")}
	if err := in.SetJSON(raw); err != nil {
		t.Fatal(err)
	}
	var got collect
	st.Process(in, &got)
	if len(got.out) != 2 {
		t.Fatalf("got %d records, want 2:\n%s", len(got.out), got.String())
	}
	first, second := got.out[0], got.out[1]
	if b, ok := second.ValueBytes(); !ok || !bytes.Equal(b, raw) {
		t.Errorf("an unchanged copy should go out as the record's bytes: %q %v", b, ok)
	}
	var after collect
	set.Process(first, &after)
	if len(after.out) != 1 {
		t.Fatalf("set: %s", after.String())
	}
	if _, ok := first.ValueBytes(); ok {
		t.Error("a copy changed by set still claims the original bytes")
	}
	if first.Value.(map[string]any)["item"] != "a" {
		t.Errorf("first copy: %v", first.Value)
	}
	if _, leaked := second.Value.(map[string]any)["item"]; leaked {
		t.Errorf("set on the first copy reached the second: %v", second.Value)
	}
	if _, leaked := in.Value.(map[string]any)["item"]; leaked {
		t.Errorf("set on a copy reached the input record: %v", in.Value)
	}
	if _, ok := in.Bound["item"]; ok {
		t.Errorf("the input record got the binding: %v", in.Bound)
	}
}
