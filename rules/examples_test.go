package rules

import (
	"bytes"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestExamplesPassCheck runs `rtproxy check` over every rules directory
// under examples/: everything shipped must be accepted.
func TestExamplesPassCheck(t *testing.T) {
	var dirs []string
	err := filepath.WalkDir("../examples", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "rules" {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no examples/**/rules directory")
	}
	var out bytes.Buffer
	ok := CheckPaths(&out, dirs)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !ok || len(lines) < 3 {
		t.Fatalf("examples refused or missing:\n%s", out.String())
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "ok ") {
			t.Errorf("not ok: %s", l)
		}
	}
}
