package rules

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestFingerprintsGolden pins the full fingerprint and canonical
// definition of every step in every rule file the docs and examples ship.
// A step's fingerprint names its state: if a refactoring of how steps are
// parsed changed one, an upgrade would silently start that step's state
// afresh (a drop_duplicates would forget every key it had seen).
func TestFingerprintsGolden(t *testing.T) {
	var lines []string
	add := func(label string, r *Route) {
		for _, s := range r.Steps {
			lines = append(lines, fmt.Sprintf("%s %02d %s %s %q", label, s.Index, s.Kind, s.Fingerprint, s.Def))
		}
	}
	dir := t.TempDir()
	blocks := docBlocks(t, "../docs/RULES.md")
	for _, b := range blocks {
		writeFiles(t, dir, map[string]string{b.name: b.body})
	}
	for _, b := range blocks {
		if b.kind != "rule-file" {
			continue
		}
		r, err := LoadFileWith(filepath.Join(dir, b.name), docsOptions)
		if err != nil {
			t.Fatalf("docs %s: %v", b.name, err)
		}
		add("docs/"+b.name, r)
	}
	err := filepath.WalkDir("../examples", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") || filepath.Base(filepath.Dir(p)) != "rules" {
			return err
		}
		r, lerr := LoadFile(p)
		if lerr != nil {
			return nil // not a rule file (TestExamplesPassCheck covers the rules dirs)
		}
		add(strings.TrimPrefix(p, "../"), r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	golden(t, "fingerprints.golden", strings.Join(lines, "\n")+"\n")
}
