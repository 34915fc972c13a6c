package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/config"
)

// TestSecurityDocNamesRealThings keeps docs/SECURITY.md honest: every test
// and fuzz target it names exists, every metric it names is registered by
// the code, and every config key in a table's "config key" column is a key
// of the proxy's config.
func TestSecurityDocNamesRealThings(t *testing.T) {
	doc := readRepoFile(t, "docs/SECURITY.md")
	root := filepath.Join("..", "..")
	tests := map[string]bool{}
	var code strings.Builder
	funcRE := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)\w+)\(`)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && p != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(p, "_test.go") {
			for _, m := range funcRE.FindAllSubmatch(b, -1) {
				tests[string(m[1])] = true
			}
		} else {
			code.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, k := range config.Keys() {
		keys[k.Path] = true
	}

	tick := regexp.MustCompile("`([^`]+)`")
	var nTests, nMetrics, nKeys int
	for _, line := range strings.Split(doc, "\n") {
		for _, m := range tick.FindAllStringSubmatch(line, -1) {
			name := m[1]
			if i := strings.IndexByte(name, '{'); i > 0 && strings.HasPrefix(name, "rtproxy_") {
				name = name[:i] // a metric with its labels
			}
			switch {
			case regexp.MustCompile(`^(Test|Fuzz)\w+$`).MatchString(name):
				nTests++
				if !tests[name] {
					t.Errorf("docs/SECURITY.md names %s, which is no test of the module", name)
				}
			case regexp.MustCompile(`^rtproxy_\w+$`).MatchString(name):
				nMetrics++
				if !strings.Contains(code.String(), `"`+name+`"`) {
					t.Errorf("docs/SECURITY.md names the metric %s, which the code does not register", name)
				}
			}
		}
		// The third column of a bound table is its config key.
		cells := strings.Split(line, "|")
		if len(cells) != 7 || strings.HasPrefix(strings.TrimSpace(cells[1]), "threat") || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		for _, m := range tick.FindAllStringSubmatch(cells[3], -1) {
			name := m[1]
			if strings.Contains(name, "MaxAliasNodes") {
				continue // a constant, said so in the row
			}
			nKeys++
			if strings.HasSuffix(name, ".*") {
				found := false
				for k := range keys {
					found = found || strings.HasPrefix(k, strings.TrimSuffix(name, "*"))
				}
				if !found {
					t.Errorf("docs/SECURITY.md names config keys %s, and there are none", name)
				}
				continue
			}
			if !keys[name] {
				t.Errorf("docs/SECURITY.md names the config key %q, which the config does not have", name)
			}
		}
	}
	if nTests < 40 || nMetrics < 10 || nKeys < 20 {
		t.Fatalf("read only %d tests, %d metrics and %d config keys from docs/SECURITY.md: is the table format changed?", nTests, nMetrics, nKeys)
	}
}
