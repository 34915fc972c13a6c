package operators

import (
	"strings"
	"testing"
	"time"
)

// TestCheckTraits: an instance that implements an interface its traits do
// not declare, or lacks one they do, is named with the trait that differs.
func TestCheckTraits(t *testing.T) {
	key := &Expr{Source: "value.k"}
	win := NewWindow(WindowSpec{Kind: "tumbling", Size: time.Minute, Aggregates: []Aggregate{{Name: "n", Func: AggCount}}})
	winTraits := Traits{Keyed: true, Timed: true, Stateful: true, Absorbing: true, Closes: true, Value: ValueReplaced}
	for _, c := range []struct {
		name   string
		t      Traits
		s      Step
		errHas string
	}{
		{"filter", Traits{}, NewFilter(key), ""},
		{"window", winTraits, win, ""},
		{"window without closes", Traits{Keyed: true, Timed: true, Stateful: true, Absorbing: true}, win, "closes declared false, built true"},
		{"filter declared keyed", Traits{Keyed: true}, NewFilter(key), "keyed declared true, built false"},
		{"dedup forever", Traits{Keyed: true}, NewDropDuplicates(key, 0, nil), ""},
		{"dedup ttl", Traits{Keyed: true, Timed: true}, NewDropDuplicates(key, time.Hour, nil), ""},
		{"dedup ttl undeclared", Traits{Keyed: true}, NewDropDuplicates(key, time.Hour, nil), "timed declared false, built true"},
	} {
		err := CheckTraits(c.t, c.s)
		switch {
		case c.errHas == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.errHas != "" && (err == nil || !strings.Contains(err.Error(), c.errHas)):
			t.Errorf("%s: got %v, want an error with %q", c.name, err, c.errHas)
		}
	}
	if !(Traits{Value: ValueMerged}).SourceShaped() || (Traits{Value: ValueReplaced}).SourceShaped() {
		t.Error("SourceShaped: only a replaced value ends the source's shape")
	}
}
