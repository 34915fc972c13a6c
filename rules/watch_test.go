package rules

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// applied is one call of apply.
type applied struct {
	at     time.Time
	routes []*Route
	errs   []error
}

// summary is a compact, comparable form: "name:filter,..." then errors.
func (a applied) summary() string {
	var parts []string
	for _, r := range a.routes {
		f := ""
		if len(r.Steps) > 0 && r.Steps[0].Kind == "filter" {
			f = stepSource(r, 0)
		}
		parts = append(parts, r.Name+"["+f+"]")
	}
	sort.Strings(parts)
	s := strings.Join(parts, " ")
	for _, e := range a.errs {
		s += " | " + e.Error()
	}
	return s
}

// stepSource is the filter of step i as the route holds it.
func stepSource(r *Route, i int) string {
	return r.Steps[i].Def
}

// metricValue reads a counter or gauge.
func metricValue(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue() + m.GetGauge().GetValue()
}

// lockedBuffer collects log output written from the watcher goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type watchHarness struct {
	logs *lockedBuffer
	t    *testing.T
	dir  string
	w    *Watcher
	ch   chan applied
	reg  *prometheus.Registry
}

func startWatch(t *testing.T, dir string) *watchHarness {
	t.Helper()
	return startWatchQuiet(t, dir, DefaultQuietPeriod)
}

func startWatchQuiet(t *testing.T, dir string, quiet time.Duration) *watchHarness {
	t.Helper()
	return startWatchWith(t, dir, quiet, DefaultResync)
}

func startWatchWith(t *testing.T, dir string, quiet, resync time.Duration, opts ...Options) *watchHarness {
	t.Helper()
	h := &watchHarness{t: t, dir: dir, ch: make(chan applied, 100), reg: prometheus.NewRegistry(), logs: &lockedBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := watch(ctx, dir, slog.New(slog.NewTextHandler(h.logs, nil)), h.reg, func(routes []*Route, errs []error) {
		h.ch <- applied{at: time.Now(), routes: routes, errs: errs}
	}, quiet, resync, opts...)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h.w = w
	t.Cleanup(func() {
		cancel()
		<-w.Done()
	})
	return h
}

// next waits for the next apply.
func (h *watchHarness) next() applied {
	h.t.Helper()
	select {
	case a := <-h.ch:
		return a
	case <-time.After(10 * time.Second): // generous: a loaded 2-core CI machine
		h.t.Fatal("no apply within 10s")
	}
	return applied{}
}

// none asserts that nothing is applied for d.
func (h *watchHarness) none(d time.Duration) {
	h.t.Helper()
	select {
	case a := <-h.ch:
		h.t.Fatalf("unexpected apply: %s", a.summary())
	case <-time.After(d):
	}
}

func (h *watchHarness) metric(result string) float64 {
	return metricValue(h.w.reloads.WithLabelValues(result))
}

func rule(name, filter string) string {
	return fmt.Sprintf("route: %s\nsource: { topic: %s.in }\nsink: { topic: %s.out }\nsteps:\n  - filter: %s\n", name, name, name, filter)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatchInitialAndAtomicRename(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), rule("a", "value.v == 1"))
	h := startWatch(t, dir)
	if got := h.next().summary(); got != "a[value.v == 1]" {
		t.Fatalf("initial = %q", got)
	}
	// An editor's save: write a temp file, rename it over the rule file.
	tmp := filepath.Join(dir, ".a.yaml.swp")
	write(t, tmp, rule("a", "value.v == 2"))
	if err := os.Rename(tmp, filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if got := h.next().summary(); got != "a[value.v == 2]" {
		t.Fatalf("after rename = %q", got)
	}
	h.none(150 * time.Millisecond)
	if got := metricValue(h.w.routes); got != 1 {
		t.Errorf("rtproxy_rules_routes = %v, want 1", got)
	}
	if h.metric("ok") != 2 || h.metric("error") != 0 {
		t.Errorf("reloads ok=%v error=%v, want 2 and 0", h.metric("ok"), h.metric("error"))
	}
}

func TestWatchInPlaceRewriteAndTouchWithoutChange(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	write(t, p, rule("a", "value.v == 1"))
	h := startWatch(t, dir)
	h.next()
	write(t, p, rule("a", "value.v == 3")) // O_TRUNC then write
	if got := h.next().summary(); got != "a[value.v == 3]" {
		t.Fatalf("after rewrite = %q", got)
	}
	// Same bytes again, and a file that is not a rule: events, but no
	// change, so no apply.
	write(t, p, rule("a", "value.v == 3"))
	write(t, filepath.Join(dir, "README.txt"), "notes")
	h.none(200 * time.Millisecond)
	// Reload (SIGHUP) with nothing changed applies nothing either.
	h.w.Reload()
	h.none(150 * time.Millisecond)
}

// writeChunks truncates path and writes content in two chunks with a
// pause in between, as some tools do.
func writeChunks(t *testing.T, path, content string, split int, pause time.Duration) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content[:split]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause)
	if _, err := f.WriteString(content[split:]); err != nil {
		t.Fatal(err)
	}
}

func TestWatchChunkedWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	write(t, p, rule("a", "value.v == 1"))
	// A longer quiet period than the default keeps the "shorter" pause
	// clearly shorter on a loaded machine.
	const quiet = 200 * time.Millisecond
	h := startWatchQuiet(t, dir, quiet)
	h.next()

	// A pause shorter than the quiet period: one apply, of the whole file.
	next := rule("a", "value.v == 2 && value.w == 2")
	split := strings.Index(next, "&&") + 1 // inside the `&&` token
	writeChunks(t, p, next, split, 10*time.Millisecond)
	if got := h.next().summary(); got != "a[value.v == 2 && value.w == 2]" {
		t.Fatalf("after short-pause chunks = %q", got)
	}
	h.none(quiet + 100*time.Millisecond)

	// A pause longer than the quiet period: the half-written file is seen
	// and refused, the previous version keeps running, then the full file
	// applies.
	next = rule("a", "value.v == 3 && value.w == 3")
	split = strings.Index(next, "&&") + 1
	writeChunks(t, p, next, split, 3*quiet)
	half := h.next()
	if len(half.routes) != 1 || stepSource(half.routes[0], 0) == "" || len(half.errs) != 1 {
		t.Fatalf("half-written apply = %q, want the old route and one error", half.summary())
	}
	if half.routes[0].Hash == "" || !strings.Contains(half.errs[0].Error(), "a.yaml:5:") {
		t.Errorf("half-written error = %v, want a.yaml:5:col", half.errs[0])
	}
	full := h.next()
	if got := full.summary(); got != "a[value.v == 3 && value.w == 3]" {
		t.Fatalf("after long-pause chunks = %q", got)
	}
}

func TestWatchHalfWrittenKeepsOldRoute(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	old := rule("a", "value.v == 1")
	write(t, p, old)
	h := startWatch(t, dir)
	first := h.next()
	oldRoute := first.routes[0]
	write(t, p, "route: a\nsource: { topic: a.in }\nsink: { topic: a.o") // truncated mid-way
	a := h.next()
	if len(a.routes) != 1 || a.routes[0] != oldRoute {
		t.Fatalf("apply after truncation = %q, want the very same old *Route", a.summary())
	}
	if len(a.errs) != 1 || !strings.HasPrefix(a.errs[0].Error(), p+":3:1: YAML syntax error: did not find expected ',' or '}'") {
		t.Fatalf("errs = %v, want one error at %s:3", a.errs, p)
	}
	if h.metric("error") != 1 {
		t.Errorf("reload errors = %v, want 1", h.metric("error"))
	}
}

func TestWatchInvalidEditThenFix(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	write(t, p, rule("a", "value.v == 1"))
	write(t, filepath.Join(dir, "b.yaml"), rule("b", "true"))
	h := startWatch(t, dir)
	if got := h.next().summary(); got != "a[value.v == 1] b[true]" {
		t.Fatalf("initial = %q", got)
	}
	write(t, p, rule("a", "valu.v == 2"))
	bad := h.next()
	want := "a[value.v == 1] b[true] | " + p + ":5:13: filter does not compile: unknown name valu; did you mean `value`? (near `valu.v == 2`)"
	if got := bad.summary(); got != want {
		t.Fatalf("after invalid edit:\n got %q\nwant %q", got, want)
	}
	if h.metric("error") != 1 || metricValue(h.w.routes) != 2 {
		t.Errorf("error reloads %v routes %v, want 1 and 2", h.metric("error"), metricValue(h.w.routes))
	}
	// b changes while a is still broken: a's error is not logged again.
	write(t, filepath.Join(dir, "b.yaml"), rule("b", "false"))
	if got := h.next(); len(got.errs) != 1 {
		t.Fatalf("after editing b = %q", got.summary())
	}
	logged := strings.Count(h.logs.String(), "level=ERROR msg=\"rules: rule file refused; its previous valid version (if any) keeps running\" err=\""+p+":5:13: filter does not compile: unknown name valu")
	if logged != 1 {
		t.Errorf("the error was logged %d times, want once with file:line:col:\n%s", logged, h.logs.String())
	}
	write(t, p, rule("a", "value.v == 2"))
	if got := h.next().summary(); got != "a[value.v == 2] b[false]" {
		t.Fatalf("after fix = %q", got)
	}
	if h.metric("ok") != 2 || h.metric("error") != 2 {
		t.Errorf("reloads ok=%v error=%v, want 2 and 2", h.metric("ok"), h.metric("error"))
	}
	// The registry serves the agreed names.
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue()
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			series = append(series, fmt.Sprintf("%s{%s} %v", mf.GetName(), labels, v))
		}
	}
	if got := strings.Join(series, ", "); got != "rtproxy_rules_reload_total{result=error} 2, rtproxy_rules_reload_total{result=ok} 2, rtproxy_rules_routes{} 2" {
		t.Errorf("registry holds %s", got)
	}
}

func TestWatchDeleteAndRestore(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	content := rule("a", "value.v == 1")
	write(t, p, content)
	write(t, filepath.Join(dir, "b.yaml"), rule("b", "true"))
	h := startWatch(t, dir)
	first := h.next()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if got := h.next().summary(); got != "b[true]" {
		t.Fatalf("after delete = %q", got)
	}
	write(t, p, content)
	back := h.next()
	if got := back.summary(); got != "a[value.v == 1] b[true]" {
		t.Fatalf("after restore = %q", got)
	}
	if back.routes[0].Hash != first.routes[0].Hash || back.routes[0].Steps[0].Fingerprint != first.routes[0].Steps[0].Fingerprint {
		t.Error("a restored file must have the same hash and fingerprints as before")
	}
}

// configMapDir lays out a Kubernetes ConfigMap volume: visible symlinks
// into ..data, which points at a timestamped directory.
func configMapDir(t *testing.T, dir, stamp string, files map[string]string) {
	t.Helper()
	ts := filepath.Join(dir, stamp)
	must(t, os.Mkdir(ts, 0o755))
	for name, content := range files {
		write(t, filepath.Join(ts, name), content)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	must(t, os.Symlink(stamp, tmp))
	must(t, os.Rename(tmp, filepath.Join(dir, "..data"))) // the atomic swap
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err != nil {
			must(t, os.Symlink(filepath.Join("..data", name), link))
		}
	}
}

func TestWatchConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	configMapDir(t, dir, "..2026_11_29_09_00_00.1", map[string]string{
		"a.yaml":  rule("a", "value.v == 1") + "tables:\n  m: { file: m.jsonl, key: id }\n",
		"m.jsonl": `{"id": "k", "version": 1}` + "\n",
	})
	h := startWatch(t, dir)
	first := h.next()
	if got := first.summary(); got != "a[value.v == 1]" {
		t.Fatalf("initial = %q", got)
	}
	configMapDir(t, dir, "..2026_11_29_09_05_00.2", map[string]string{
		"a.yaml":  rule("a", "value.v == 2") + "tables:\n  m: { file: m.jsonl, key: id }\n",
		"m.jsonl": `{"id": "k", "version": 2}` + "\n",
	})
	must(t, os.RemoveAll(filepath.Join(dir, "..2026_11_29_09_00_00.1")))
	a := h.next()
	if got := a.summary(); got != "a[value.v == 2]" {
		t.Fatalf("after ..data swap = %q", got)
	}
	row, ok := a.routes[0].Tables["m"].Table.Lookup("k")
	if !ok || fmt.Sprint(row["version"]) != "2" {
		t.Errorf("table row after swap = %v, want version 2", row)
	}
	h.none(150 * time.Millisecond)
}

func TestWatchTableFileChangeRecompiles(t *testing.T) {
	dir := t.TempDir()
	tables := t.TempDir() // a table outside the rules directory, in tables_dir
	tp := filepath.Join(tables, "m.csv")
	write(t, tp, "id,name\nk,first\n")
	write(t, filepath.Join(dir, "a.yaml"), rule("a", "true")+"tables:\n  m: { file: "+tp+", key: id }\n")
	h := startWatchWith(t, dir, DefaultQuietPeriod, DefaultResync, Options{TablesDir: tables})
	first := h.next()
	write(t, tp, "id,name\nk,second\n")
	a := h.next()
	if a.routes[0].Hash == first.routes[0].Hash {
		t.Error("route hash must change with its table file")
	}
	if row, _ := a.routes[0].Tables["m"].Table.Lookup("k"); row["name"] != "second" {
		t.Errorf("row = %v, want the new table content", row)
	}
	// A broken table keeps the previous version of the route.
	write(t, tp, "name\nno-key-column\n")
	b := h.next()
	if b.routes[0] != a.routes[0] || len(b.errs) != 1 || !strings.Contains(b.errs[0].Error(), "m.csv:1: header") {
		t.Errorf("after a broken table: %s", b.summary())
	}
}

func TestWatchDuplicateNameKeepsRunningRoute(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "b.yaml"), rule("x", "value.v == 1"))
	h := startWatch(t, dir)
	h.next()
	// a.yaml sorts first, but b.yaml's route already runs under the name.
	write(t, filepath.Join(dir, "a.yaml"), rule("x", "value.v == 9"))
	a := h.next()
	want := fmt.Sprintf("x[value.v == 1] | %s:1:8: route name `x` is already used by %s:1:8; route names must be unique in the rules directory, rename one of them (near `x`)",
		filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"))
	if got := a.summary(); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

// TestWatchReloadLatency measures the time from the last write to apply.
// The target is under 200ms (quiet period 50ms plus the reload).
func TestWatchReloadLatency(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	write(t, p, rule("a", "value.v == 0"))
	h := startWatch(t, dir)
	h.next()
	var lat []time.Duration
	for i := 1; i <= 10; i++ {
		write(t, p, rule("a", fmt.Sprintf("value.v == %d", i)))
		wrote := time.Now()
		a := h.next()
		if got := a.summary(); got != fmt.Sprintf("a[value.v == %d]", i) {
			t.Fatalf("edit %d applied %q", i, got)
		}
		lat = append(lat, a.at.Sub(wrote))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("reload-to-apply after the last write: min %v median %v max %v", lat[0], lat[len(lat)/2], lat[len(lat)-1])
	if lat[len(lat)/2] > 200*time.Millisecond {
		t.Errorf("median reload-to-apply %v, target < 200ms", lat[len(lat)/2])
	}
}

func TestWatchRelativeDirGivesAbsolutePaths(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), rule("a", "valu"))
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, dir)
	if err != nil {
		t.Fatal(err)
	}
	h := startWatch(t, rel)
	a := h.next()
	if len(a.errs) != 1 || !strings.HasPrefix(a.errs[0].Error(), filepath.Join(dir, "a.yaml")+":5:13: ") {
		t.Fatalf("errs = %v, want one error naming the absolute path", a.errs)
	}
	write(t, filepath.Join(dir, "a.yaml"), rule("a", "true"))
	if b := h.next(); len(b.routes) != 1 || b.routes[0].File != filepath.Join(dir, "a.yaml") {
		t.Fatalf("route file = %v", b.summary())
	}
}

// TestWatchFollowsSwappedDirectory: the rules path is a symlink that a
// deploy tool (git-sync) points at a new directory; the watcher follows it
// and keeps seeing edits in the new directory.
func TestWatchFollowsSwappedDirectory(t *testing.T) {
	root := t.TempDir()
	v1, v2 := filepath.Join(root, "rev1"), filepath.Join(root, "rev2")
	must(t, os.Mkdir(v1, 0o755))
	must(t, os.Mkdir(v2, 0o755))
	write(t, filepath.Join(v1, "a.yaml"), rule("a", "value.v == 1"))
	write(t, filepath.Join(v2, "a.yaml"), rule("a", "value.v == 2"))
	link := filepath.Join(root, "current")
	must(t, os.Symlink("rev1", link))
	h := startWatchWith(t, link, DefaultQuietPeriod, 300*time.Millisecond)
	if got := h.next().summary(); got != "a[value.v == 1]" {
		t.Fatalf("initial = %q", got)
	}
	tmp := filepath.Join(root, "current.tmp")
	must(t, os.Symlink("rev2", tmp))
	must(t, os.Rename(tmp, link)) // nothing in the watched directory changed
	if got := h.next().summary(); got != "a[value.v == 2]" {
		t.Fatalf("after the swap = %q", got)
	}
	must(t, os.RemoveAll(v1))
	// An edit in the new directory is seen by its events, well before the
	// next resync.
	write(t, filepath.Join(v2, "a.yaml"), rule("a", "value.v == 3"))
	a := h.next()
	if got := a.summary(); got != "a[value.v == 3]" {
		t.Fatalf("after an edit in the new directory = %q", got)
	}
}
