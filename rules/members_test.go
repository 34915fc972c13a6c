package rules

import (
	"path/filepath"
	"slices"
	"testing"
)

// TestSourceMembers: the loader names the top-level members of the source
// value that expressions read before a map or window replaces it, and
// decodes whole when one reads the value as a whole.
func TestSourceMembers(t *testing.T) {
	for _, c := range []struct {
		name, steps string
		members     []string
		partial     bool
	}{
		{"filter-set-map", `
  - filter: value.amount > 0 && value.card.country == "FR"
  - set: { risk: value.amount / 2 }
  - map: { user: value.user, risk: value.risk }
  - filter: value.risk > 1`, []string{"amount", "card", "risk", "ts", "user"}, true},
		{"window", `
  - window: { kind: tumbling, size: 1m, key: value.page, aggregate: { n: count(), u: count_distinct(value.user) } }
  - filter: value.n > 1`, []string{"page", "ts", "user"}, true},
		{"whole", `
  - map: { all: value }`, nil, false},
		{"computed", `
  - filter: value[headers.field] != nil`, nil, false},
		{"no reads", `
  - filter: headers.env != "test"`, []string{"ts"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			src := "route: r\nsource: { topic: a, event_time: value.ts }\nsink: { topic: b }\nsteps:" + c.steps + "\n"
			writeFiles(t, dir, map[string]string{"r.yaml": src})
			r, err := LoadFile(filepath.Join(dir, "r.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if r.Source.DecodeMembers != c.partial || (c.partial && !slices.Equal(r.Source.Members, c.members)) {
				t.Fatalf("DecodeMembers %v members %v, want %v %v", r.Source.DecodeMembers, r.Source.Members, c.partial, c.members)
			}
		})
	}
	// A raw route never decodes JSON.
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"r.yaml": "route: r\nsource: { topic: a, format: raw }\nsink: { topic: b }\nsteps:\n  - filter: value contains \"x\"\n"})
	r, err := LoadFile(filepath.Join(dir, "r.yaml"))
	if err != nil || r.Source.DecodeMembers {
		t.Fatalf("raw: %v %v", err, r.Source.DecodeMembers)
	}
}
