// Package layering holds the test that keeps rtproxy's import graph
// layered: every package of the module may import only the packages of the
// module its row of the table below names, and the table is the one
// docs/ARCHITECTURE.md shows ("Packages and their arrows"). It asks `go
// list -json` for the real graph, as CoreDNS's presubmit checks do.
package layering

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/rtproxy/rtproxy"

// allowed is, for each package of the module (its import path below the
// module), the packages of the module it may import. Outside packages
// (the standard library, franz-go, pebble, ...) are not this table's
// business. Moving a package is editing its key and the rows that name it.
//
// The rows down to internal/benchkit are the product: docs/ARCHITECTURE.md
// shows the same arrows, and TestArchitectureTableMatches holds the two
// together. The rest are tools and test harnesses.
var allowed = map[string][]string{
	// the binary: wiring
	"cmd/rtproxy": {"config", "cmd/rtproxy/internal/ruletest", "internal/serde", "internal/srembed", "operators", "pipeline", "protocol", "rules", "state"},
	// apps the binary runs
	"cmd/rtproxy/internal/ruletest": {"internal/jsoncodec", "internal/yamlbudget", "internal/yamlpos", "operators", "pipeline", "rules"},
	"pipeline":                      {"internal/jsoncodec", "internal/serde", "offsets", "operators", "rules", "state"},
	"protocol":                      {},
	"config":                        {"internal/yamlbudget"},
	// rule files and the steps they compile to
	"rules":          {"internal/jsoncodec", "internal/serde", "internal/yamlbudget", "internal/yamlpos", "operators"},
	"internal/serde": {"internal/jsoncodec"},
	"operators":      {"internal/jsoncodec"},
	"state":          {"offsets"},
	// leaves
	"offsets":             {},
	"internal/jsoncodec":  {},
	"internal/yamlpos":    {},
	"internal/yamlbudget": {},
	"internal/srembed":    {},
	"internal/testkit":    {},
	"internal/benchkit":   {},

	// tools and test harnesses
	"rules/internal/refgen":      {"rules"},
	"deploy":                     {"config"},
	"deploy/deploycheck":         {"config", "internal/yamlbudget"},
	"test/layering":              {"operators", "rules"},
	"test/integration":           {"internal/srembed", "test/shapes"},
	"test/kfakebroker":           {},
	"test/httpsinkserver":        {},
	"test/srfakebroker":          {"internal/srembed"},
	"test/shapes":                {"pipeline", "rules"},
	"test/bench/exactlyonce":     {"config", "internal/benchkit", "pipeline", "rules"},
	"test/bench/footprint":       {"internal/benchkit"},
	"test/bench/guard":           {"internal/benchkit"},
	"test/bench/pipeline":        {"config", "internal/benchkit", "internal/jsoncodec", "pipeline", "rules"},
	"test/bench/proxy":           {"internal/benchkit"},
	"test/bench/proxy/proxyproc": {"operators", "protocol", "rules"},
	"test/bench/reload":          {"internal/benchkit"},
	"test/bench/scale":           {"internal/benchkit"},
	"test/bench/soak":            {"internal/benchkit"},
	"test/bench/tap":             {"internal/benchkit"},
}

// testHarnesses may be imported by any package's tests besides what its
// row allows.
var testHarnesses = []string{"internal/testkit", "internal/benchkit"}

// testOnly are arrows a package's tests may have beyond its row: the
// operators' benchmarks measure their steps on the real pebble store, which
// the steps themselves reach only through operators.KV.
var testOnly = map[string][]string{
	"operators": {"state"},
}

// backwards are the arrows that run from the internal/ drawer, which is
// meant for leaf libraries, up to a package outside it: app code filed as
// a leaf. They are allowed above until the drawer is split; any other
// arrow out of internal/ fails TestInternalHoldsLeaves, and one listed
// here that is gone fails it too, so the list stays true.
var backwards = []string{}

// pkg is what `go list -json` says of a package.
type pkg struct {
	ImportPath   string
	GoFiles      []string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

// listModule runs `go list -json` over every package of the module.
func listModule(t *testing.T) []pkg {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,GoFiles,Imports,TestImports,XTestImports,Error", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages in %s", len(pkgs), root)
	}
	return pkgs
}

// moduleRoot is the directory of the module's go.mod, above this one.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module "+module+"\n")) {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("no go.mod of %s above the test", module)
		}
		dir = up
	}
}

// local is an import path below the module, ok false for one outside it.
func local(path string) (string, bool) {
	if path == module {
		return "", true
	}
	rest, ok := strings.CutPrefix(path, module+"/")
	return rest, ok
}

// arrows are p's imports within the module, without p itself (an external
// test package imports the package it tests).
func arrows(self string, imports []string) []string {
	var out []string
	for _, imp := range imports {
		if l, ok := local(imp); ok && l != self && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

// TestImportsFollowTheTable: no package of the module imports one its row
// of allowed does not name, and every package has a row.
func TestImportsFollowTheTable(t *testing.T) {
	for _, p := range listModule(t) {
		self, _ := local(p.ImportPath)
		may, ok := allowed[self]
		if !ok {
			t.Errorf("package %s has no row in the layering table (test/layering/layering_test.go): add one naming what it may import, and its row in docs/ARCHITECTURE.md if it is part of the product", self)
			continue
		}
		for _, to := range arrows(self, p.Imports) {
			if !slices.Contains(may, to) {
				t.Errorf("forbidden arrow %s -> %s: %s may import only %v (test/layering, docs/ARCHITECTURE.md \"Packages and their arrows\")", self, to, self, may)
			}
		}
		for _, to := range arrows(self, append(slices.Clone(p.TestImports), p.XTestImports...)) {
			if !slices.Contains(may, to) && !slices.Contains(testHarnesses, to) && !slices.Contains(testOnly[self], to) {
				t.Errorf("forbidden arrow %s (tests) -> %s: its tests may import only %v and the harnesses %v", self, to, may, testHarnesses)
			}
		}
	}
}

// TestInternalHoldsLeaves: a package under internal/ imports nothing of the
// module outside internal/, except the known backwards arrows.
func TestInternalHoldsLeaves(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range listModule(t) {
		self, _ := local(p.ImportPath)
		if !strings.HasPrefix(self, "internal/") {
			continue
		}
		for _, to := range arrows(self, p.Imports) {
			if strings.HasPrefix(to, "internal/") {
				continue
			}
			a := self + " -> " + to
			seen[a] = true
			if !slices.Contains(backwards, a) {
				t.Errorf("backwards arrow %s: internal/ holds leaf libraries, which import nothing above them; move %s out of internal/ or the code it needs into it", a, self)
			}
		}
	}
	for _, a := range backwards {
		if !seen[a] {
			t.Errorf("%s is listed as a backwards arrow but no longer exists: remove it from the list", a)
		}
	}
}

var (
	rowRe  = regexp.MustCompile("^\\| `([^`]+)` \\|.*\\| ([^|]*) \\|$")
	tickRe = regexp.MustCompile("`([^`]+)`")
)

// TestArchitectureTableMatches: docs/ARCHITECTURE.md's table of packages
// names, for each product package, exactly the module packages its row
// here allows (in backticks; outside libraries are written plainly), and
// every product package has its row there.
func TestArchitectureTableMatches(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc := map[string][]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Packages and their arrows"
			continue
		}
		m := rowRe.FindStringSubmatch(line)
		if !in || m == nil {
			continue
		}
		var imps []string
		for _, x := range tickRe.FindAllStringSubmatch(m[2], -1) {
			if _, ok := allowed[x[1]]; ok {
				imps = append(imps, x[1])
			}
		}
		sort.Strings(imps)
		doc[m[1]] = imps
	}
	if len(doc) == 0 {
		t.Fatal(`docs/ARCHITECTURE.md has no "## Packages and their arrows" table`)
	}
	for name, imps := range doc {
		may, ok := allowed[name]
		if !ok {
			t.Errorf("docs/ARCHITECTURE.md lists %s, which the layering table does not know", name)
			continue
		}
		may = slices.Sorted(slices.Values(may))
		if !slices.Equal(imps, may) {
			t.Errorf("docs/ARCHITECTURE.md: %s imports %v; the layering table allows %v", name, imps, may)
		}
	}
	for name := range allowed {
		product := !strings.HasPrefix(name, "test/") && !strings.HasPrefix(name, "deploy") && !strings.Contains(name, "/internal/")
		if _, ok := doc[name]; product && !ok {
			t.Errorf("%s has no row in docs/ARCHITECTURE.md's table of packages", name)
		}
	}
}
