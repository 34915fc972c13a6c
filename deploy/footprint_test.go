package deploy

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// footprintMarker opens the table of the latest `make bench-footprint` in
// docs/BENCHMARKS.md that the chart's requests are sized from.
const footprintMarker = "<!-- footprint: the chart's requests are sized from this table (deploy/footprint_test.go) -->"

// measuredFootprint reads that table's "after" rows: the largest idle RSS
// (MiB) and idle CPU (millicores) measured.
func measuredFootprint(t *testing.T, root string) (rssMiB, milli float64) {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs", "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in, rows := false, 0
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == footprintMarker {
			in = true
			continue
		}
		if !in {
			continue
		}
		if rows > 0 && !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(line, "|")
		if len(cells) < 6 || strings.TrimSpace(cells[1]) != "after" {
			if strings.HasPrefix(line, "|") {
				rows++
			}
			continue
		}
		rows++
		r, err1 := strconv.ParseFloat(strings.TrimSpace(cells[3]), 64)
		c, err2 := strconv.ParseFloat(strings.TrimSpace(cells[4]), 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("footprint row %q: RSS or CPU is not a number", line)
		}
		rssMiB, milli = max(rssMiB, r), max(milli, c)
	}
	if rssMiB == 0 {
		t.Fatalf("no \"after\" rows under %q in docs/BENCHMARKS.md", footprintMarker)
	}
	return rssMiB, milli
}

var quantity = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(m|Mi|Gi)?$`)

// parseQuantity reads the Kubernetes quantities the chart uses: memory in
// Mi or Gi (returned in MiB), CPU in cores or millicores (returned in
// millicores).
func parseQuantity(t *testing.T, s string) float64 {
	t.Helper()
	m := quantity.FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("quantity %q: not one this test reads", s)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	switch m[2] {
	case "Gi":
		return v * 1024
	case "":
		return v * 1000 // cores
	}
	return v // Mi, or m
}

// TestChartRequestsCoverTheFootprint: the chart's default resources, and
// the sidecar values of its examples, request at least what an idle
// sidecar was measured to use (the quickstart's routes plus five idle ones,
// `make bench-footprint`), with room for a working set (1.25×), and their
// memory limits are at least twice the request; a remeasure that outgrows
// them fails here until the chart follows (issue 29).
func TestChartRequestsCoverTheFootprint(t *testing.T) {
	root := testkit.ModuleRoot(t)
	rss, milli := measuredFootprint(t, root)
	for _, c := range []struct{ file, path string }{
		{"deploy/helm/rtproxy/values.yaml", "resources"},
		{"deploy/helm/examples/values/sidecar.yaml", "resources"},
		{"deploy/helm/examples/app/values.yaml", "rtproxy.resources"},
	} {
		b, err := os.ReadFile(filepath.Join(root, c.file))
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		var res any = v
		for _, k := range strings.Split(c.path, ".") {
			m, _ := res.(map[string]any)
			res = m[k]
		}
		get := func(kind, what string) string {
			m, _ := res.(map[string]any)
			k, _ := m[kind].(map[string]any)
			s, _ := k[what].(string)
			if s == "" {
				t.Fatalf("%s: %s.%s.%s missing", c.file, c.path, kind, what)
			}
			return s
		}
		reqMem, limMem, reqCPU := parseQuantity(t, get("requests", "memory")), parseQuantity(t, get("limits", "memory")), parseQuantity(t, get("requests", "cpu"))
		if reqMem < 1.25*rss {
			t.Errorf("%s: %s.requests.memory %.0f MiB is under 1.25× the measured idle RSS %.1f MiB", c.file, c.path, reqMem, rss)
		}
		if limMem < 2*reqMem {
			t.Errorf("%s: %s.limits.memory %.0f MiB is under twice the request %.0f MiB", c.file, c.path, limMem, reqMem)
		}
		if reqCPU < milli {
			t.Errorf("%s: %s.requests.cpu %.0fm is under the measured idle %.2f millicores", c.file, c.path, reqCPU, milli)
		}
	}
}
