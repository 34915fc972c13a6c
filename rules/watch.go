package rules

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultQuietPeriod is how long the watcher waits after the last file
// event before it re-reads the directory: editors and ConfigMap updates
// produce bursts of events for one logical change.
const DefaultQuietPeriod = 50 * time.Millisecond

// DefaultResync is how often the watcher re-reads the directory without
// any event: a safety net for events a filesystem never delivers (network
// filesystems) and for a rules directory replaced by a new one (a symlink
// swapped to another directory, as git-sync does).
const DefaultResync = 10 * time.Second

// incompleteHold is how long a changed rule file that is valid but does
// not end with a newline must stay unchanged before it applies. A file cut
// mid-line by a writer that paused (an in-place write in chunks) can still
// be a valid rule, e.g. `value.amount > 1000` cut to `value.amount > 1`;
// such a cut almost never ends with a newline, while a complete file
// almost always does. A file that genuinely lacks the final newline only
// applies this much later.
const incompleteHold = time.Second

// maxSettle bounds the debounce: a directory that never goes quiet is
// still re-read this often.
const maxSettle = time.Second

// Watcher follows a rules directory and calls apply with the full desired
// set of routes (guard files among them, with Route.Guard set) whenever
// the content of a rule file, or of a table file a route reads, changes.
//
// Invariants:
//  1. apply is called only from one goroutine at a time, first from Watch
//     itself, and only when the set (route hashes and errors) changed.
//  2. A file whose current content is invalid keeps its last valid route in
//     the set; the error travels alongside it.
//  3. What a file holds is decided by its content hash after a quiet
//     period, never by the kind of event seen.
type Watcher struct {
	dir    string
	opts   Options
	log    *slog.Logger
	apply  func([]*Route, []error)
	quiet  time.Duration
	resync time.Duration
	hold   time.Duration // incompleteHold
	fsw    *fsnotify.Watcher
	// dirInfo identifies the directory being watched; when the path names
	// another directory, the watch moves to it.
	dirInfo os.FileInfo

	reloadCh chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}

	reloads *prometheus.CounterVec
	routes  prometheus.Gauge

	// Owned by the loop goroutine (by Watch before the loop starts).
	files   map[string]*watchedFile
	dirs    map[string]bool
	applied string
	first   bool
	logged  map[string]bool // errors already logged, so a lasting error is logged once
	recheck time.Duration   // set by scan: re-read after this (a held file); 0: no need
}

// watchedFile is what the watcher remembers of one rule file.
type watchedFile struct {
	contentHash string
	guard       bool   // a guard file (or, not parsed, looks like one)
	guardTopic  string // its topic when it could be read
	view        bool   // a view file (or, not parsed, looks like one)
	viewTopic   string // its topic when it could be read
	tableFiles  []string
	tableHash   string
	name        string   // route name of the current content
	namePos     position // where it is written
	cur         *Route   // the current content's route; nil when invalid
	errs        ErrorList
	good        *Route // the last route of this file that was accepted
	// heldHash is valid content without a final newline that waits to be
	// unchanged for hold since heldSince before it applies.
	heldHash  string
	heldSince time.Time
}

// Watch loads dir, calls apply with the result, and then follows the
// directory until ctx is done. The rules directory must exist. reg may be
// nil (no metrics); log may be nil (slog.Default()).
func Watch(ctx context.Context, dir string, log *slog.Logger, reg prometheus.Registerer, apply func(routes []*Route, errs []error)) (*Watcher, error) {
	return WatchWith(ctx, dir, Options{}, log, reg, apply)
}

// WatchWith is Watch with o.
func WatchWith(ctx context.Context, dir string, o Options, log *slog.Logger, reg prometheus.Registerer, apply func(routes []*Route, errs []error)) (*Watcher, error) {
	w, err := watch(ctx, dir, log, reg, apply, DefaultQuietPeriod, DefaultResync, o)
	return w, err
}

func watch(ctx context.Context, dir string, log *slog.Logger, reg prometheus.Registerer, apply func([]*Route, []error), quiet, resync time.Duration, opts ...Options) (*Watcher, error) {
	if log == nil {
		log = slog.Default()
	}
	// Absolute paths throughout, so an error's File and its route's File
	// name the same file (pipeline matches them for /routes).
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("rules directory: %w", unwrapPathError(err))
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("rules directory %s is not a directory", dir)
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("rules watcher: %w", err)
	}
	if err := fsw.Add(dir); err != nil {
		fsw.Close()
		return nil, fmt.Errorf("rules watcher: watch %s: %w", dir, err)
	}
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	w := &Watcher{
		opts:     o,
		dir:      dir,
		log:      log,
		apply:    apply,
		quiet:    quiet,
		resync:   resync,
		hold:     incompleteHold,
		dirInfo:  fi,
		fsw:      fsw,
		reloadCh: make(chan struct{}, 1),
		done:     make(chan struct{}),
		files:    map[string]*watchedFile{},
		dirs:     map[string]bool{filepath.Clean(dir): true},
		first:    true,
	}
	w.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtproxy_rules_reload_total",
		Help: "Reloads of the rules directory that changed the route set, by result: ok, or error when any rule file was refused.",
	}, []string{"result"})
	w.routes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rtproxy_rules_routes",
		Help: "Routes in the current rule set, guards and views not included (a refused file that keeps its previous valid version counts).",
	})
	if reg != nil {
		w.reloads = register(reg, w.reloads).(*prometheus.CounterVec)
		w.routes = register(reg, w.routes).(prometheus.Gauge)
	}
	// Both label values exist from the start, so a dashboard sees 0, not
	// a missing series.
	w.reloads.WithLabelValues("ok")
	w.reloads.WithLabelValues("error")

	w.scan()
	ctx, w.cancel = context.WithCancel(ctx)
	go w.loop(ctx)
	return w, nil
}

// register registers c, or returns the collector already registered under
// the same name (a second watcher on one registry shares the series).
func register(reg prometheus.Registerer, c prometheus.Collector) prometheus.Collector {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return are.ExistingCollector
		}
	}
	return c
}

// Reload asks the watcher to re-read the directory now (SIGHUP). It does
// not wait; apply runs only if something changed.
func (w *Watcher) Reload() {
	select {
	case w.reloadCh <- struct{}{}:
	default: // a reload is already pending
	}
}

// Close stops watching and waits for the watcher's goroutine to end.
func (w *Watcher) Close() error {
	w.cancel()
	<-w.done
	return nil
}

// Done is closed when the watcher has stopped.
func (w *Watcher) Done() <-chan struct{} { return w.done }

func (w *Watcher) loop(ctx context.Context) {
	defer close(w.done)
	defer w.fsw.Close()
	var (
		timer     = time.NewTimer(time.Hour)
		pending   bool
		firstSeen time.Time
	)
	timer.Stop()
	resync := time.NewTicker(w.resync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-resync.C:
			w.scan()
			w.armRecheck(timer, pending)
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			w.log.Debug("rules: file event", "name", ev.Name, "op", ev.Op.String())
			now := time.Now()
			if !pending {
				pending, firstSeen = true, now
			}
			wait := w.quiet
			if over := now.Sub(firstSeen) + wait - maxSettle; over > 0 {
				wait -= over
			}
			timer.Reset(max(wait, 0))
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			// An overflow drops events; a full re-read makes up for them.
			w.log.Warn("rules: watch error; re-reading the directory", "dir", w.dir, "err", err)
			pending, firstSeen = true, time.Now()
			timer.Reset(w.quiet)
		case <-timer.C:
			pending = false
			w.scan()
			w.armRecheck(timer, pending)
		case <-w.reloadCh:
			w.log.Info("rules: reload requested", "dir", w.dir)
			w.scan()
			w.armRecheck(timer, pending)
		}
	}
}

// armRecheck schedules the next scan for a held file, unless a debounce
// is pending (its scan comes first and re-arms).
func (w *Watcher) armRecheck(timer *time.Timer, pending bool) {
	if w.recheck > 0 && !pending {
		timer.Reset(max(w.recheck, w.quiet))
	}
}

// hashFiles hashes the content of files (missing ones hash as missing).
func hashFiles(paths []string) string {
	h := sha256.New()
	for _, p := range paths {
		fmt.Fprintf(h, "%s\x00", p)
		b, err := os.ReadFile(p)
		if err != nil {
			fmt.Fprintf(h, "missing\x00")
			continue
		}
		h.Write(b)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// scan re-reads the directory, reloads what changed and applies the result
// if the set differs from the one last applied.
func (w *Watcher) scan() {
	w.followDir()
	files, err := ruleFiles(w.dir)
	if err != nil {
		// The directory is gone or unreadable (a remount in progress):
		// keep running what runs and try again at the next event.
		w.log.Error("rules: cannot read rules directory; keeping the current routes", "dir", w.dir, "err", err)
		w.reloads.WithLabelValues("error").Inc()
		return
	}
	present := map[string]bool{}
	w.recheck = 0
	for _, path := range files {
		present[path] = true
		src, err := readRuleFile(w.dir, path)
		var refused *FileRefusedError
		if errors.As(err, &refused) {
			// Resolves out of the directory, not a regular file, or too
			// large: refused unread, like invalid content (its last valid
			// version, if any, keeps running). The refusal is its "content".
			src = []byte("\x00refused\x00" + refused.Msg)
		} else if err != nil {
			// Deleted between listing and reading: the next event rescans.
			continue
		}
		sum := sha256.Sum256(src)
		ch := hex.EncodeToString(sum[:])
		wf := w.files[path]
		if refused != nil {
			if wf == nil {
				wf = &watchedFile{}
				w.files[path] = wf
			}
			if wf.contentHash != ch {
				wf.heldHash = ""
				wf.contentHash, wf.tableFiles, wf.tableHash = ch, nil, hashFiles(nil)
				wf.name, wf.namePos = "", position{}
				wf.cur, wf.errs = nil, ErrorList{readError(path, err)}
			}
			continue
		}
		if wf != nil && wf.contentHash == ch && hashFiles(wf.tableFiles) == wf.tableHash {
			wf.heldHash = ""
			continue
		}
		if wf == nil {
			wf = &watchedFile{}
			w.files[path] = wf
		}
		res := loadBytes(path, src, w.opts)
		// Valid content without a final newline may be a file cut mid-line
		// by a writer still at work: it applies once unchanged for hold.
		// At the first scan nothing runs yet, so nothing is held.
		if !w.first && res.route != nil && len(src) > 0 && src[len(src)-1] != '\n' {
			if wf.heldHash != ch {
				wf.heldHash, wf.heldSince = ch, time.Now()
				w.log.Info("rules: rule file changed and does not end with a newline; it may still be being written, so it applies once unchanged for the hold period (save by atomic rename to avoid this)",
					"file", path, "hold", w.hold)
			}
			if wait := w.hold - time.Since(wf.heldSince); wait > 0 {
				if w.recheck == 0 || wait < w.recheck {
					w.recheck = wait
				}
				continue
			}
		}
		wf.heldHash = ""
		wf.contentHash = ch
		wf.tableFiles = res.tableFiles
		wf.tableHash = hashFiles(res.tableFiles)
		wf.name, wf.namePos = res.name, res.nameNode
		wf.guard, wf.guardTopic = res.guard, res.guardTopic
		wf.view, wf.viewTopic = res.view, res.viewTopic
		wf.cur, wf.errs = res.route, res.errs
		for _, e := range res.warns {
			w.log.Warn("rules: "+e.Msg, "at", fmt.Sprintf("%s:%d:%d", e.File, e.Line, e.Col))
		}
	}
	for path := range w.files {
		if !present[path] {
			delete(w.files, path)
		}
	}
	routes, errs := w.resolve()
	w.watchTableDirs()

	sig := signature(routes, errs)
	if !w.first && sig == w.applied {
		return
	}
	w.first = false
	w.applied = sig
	result := "ok"
	if len(errs) > 0 {
		result = "error"
	}
	w.reloads.WithLabelValues(result).Inc()
	var names, guards, views []string
	for _, r := range routes {
		switch {
		case r.Guard != nil:
			guards = append(guards, r.Name)
		case r.View != nil:
			views = append(views, r.Name)
		default:
			names = append(names, r.Name)
		}
	}
	w.routes.Set(float64(len(names)))
	logged := make(map[string]bool, len(errs))
	for _, e := range errs {
		msg := e.Error()
		logged[msg] = true
		if !w.logged[msg] {
			w.log.Error("rules: rule file refused; its previous valid version (if any) keeps running", "err", msg)
		}
	}
	w.logged = logged
	w.log.Info("rules: applying rule set", "dir", w.dir, "routes", strings.Join(names, ","), "guards", strings.Join(guards, ","), "views", strings.Join(views, ","), "errors", len(errs))
	w.apply(routes, errs)
}

// resolve decides the desired set: each file's current route if valid,
// else its last good one; a route name already taken by a file that
// claimed it earlier is refused, and so is a route that conflicts in the
// route graph (graph.go: a shared group, a cycle, an internal topic) with
// one accepted earlier. Files whose running route holds a name claim it
// first, so a new file cannot take over a running route's name.
func (w *Watcher) resolve() ([]*Route, []error) {
	paths := make([]string, 0, len(w.files))
	for p := range w.files {
		paths = append(paths, p)
	}
	// Claims go first to files that run unchanged (or whose edit is
	// invalid, so they run unchanged), then to running files whose edit
	// is valid, then to new files: an edit or a new file that conflicts
	// with a running route (a name, a group, a cycle) is the one refused.
	rank := func(wf *watchedFile) int {
		switch {
		case wf.good != nil && (wf.cur == nil || wf.cur == wf.good):
			return 0
		case wf.good != nil:
			return 1
		}
		return 2
	}
	sort.Slice(paths, func(i, j int) bool {
		ri, rj := rank(w.files[paths[i]]), rank(w.files[paths[j]])
		if ri != rj {
			return ri < rj
		}
		return paths[i] < paths[j]
	})
	type claim struct {
		at    string // "file:line:col"
		guard bool
	}
	taken := map[string]claim{}  // route or guard name -> who holds it
	g := newGraph()              // groups, cycles and internal topics (graph.go)
	inForce := map[string]bool{} // files with a route or guard in the set
	var routes []*Route
	var errs []error
	for _, p := range paths {
		wf := w.files[p]
		for _, e := range wf.errs {
			errs = append(errs, e)
		}
		cand := wf.cur
		if cand == nil {
			cand = wf.good
		}
		if cand == nil {
			continue
		}
		if first, dup := taken[claimKey(cand.Name, cand.View != nil)]; dup {
			msg := nameTaken(cand.Name, cand.Guard != nil, first.guard, first.at)
			if cand.View != nil {
				msg = viewNameTaken(cand.Name, first.at)
			}
			errs = append(errs, &Error{
				File: p, Line: wf.namePos.line, Col: wf.namePos.col, Text: cand.Name, Msg: msg,
			})
			cand = nil
			if wf.good != nil && wf.good != wf.cur {
				if _, dup := taken[claimKey(wf.good.Name, wf.good.View != nil)]; !dup {
					cand = wf.good
				}
			}
			if cand == nil {
				continue
			}
		}
		if gerrs := g.check(cand); len(gerrs) > 0 {
			// The file conflicts with a route accepted before it (one
			// that runs, or an earlier file): it is refused, and its
			// previous version runs on if that one fits.
			for _, e := range gerrs {
				e.File = p
				errs = append(errs, e)
			}
			if cand == wf.cur && wf.good != nil && wf.good != wf.cur && len(g.check(wf.good)) == 0 {
				if _, dup := taken[claimKey(wf.good.Name, wf.good.View != nil)]; !dup {
					cand = wf.good
				} else {
					continue
				}
			} else {
				continue
			}
		}
		if cand == wf.cur {
			wf.good = wf.cur
		}
		g.add(cand)
		taken[claimKey(cand.Name, cand.View != nil)] = claim{fmt.Sprintf("%s:%d:%d", p, wf.namePos.line, wf.namePos.col), cand.Guard != nil}
		routes = append(routes, cand)
		inForce[p] = true
	}
	// A guard file with nothing in force fails closed: a stand-in refuses
	// what is produced to its topic until the file loads (closedGuard).
	for _, p := range paths {
		if wf := w.files[p]; wf.guard && !inForce[p] {
			routes = append(routes, closedGuard(p, wf.name, wf.guardTopic, wf.contentHash))
		}
	}
	// So does a view file: its clients get placeholders, never the
	// originals, until it loads (closedView); not when another file's view
	// holds the name (that one applies).
	for _, p := range paths {
		wf := w.files[p]
		if !wf.view || inForce[p] {
			continue
		}
		if _, held := taken[claimKey(wf.name, true)]; held {
			continue
		}
		if cv := closedView(p, wf.name, wf.viewTopic, wf.contentHash); cv != nil {
			taken[claimKey(wf.name, true)] = claim{at: p}
			routes = append(routes, cv)
		}
	}
	sort.Slice(routes, func(i, j int) bool { return routes[i].File < routes[j].File })
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return routes, errs
}

// followDir moves the watch when the rules path now names another
// directory than the one watched (the directory was replaced, or the
// symlink it is was pointed elsewhere): the old watch sees nothing more.
func (w *Watcher) followDir() {
	fi, err := os.Stat(w.dir)
	if err != nil || os.SameFile(fi, w.dirInfo) {
		return
	}
	_ = w.fsw.Remove(w.dir) // the old directory may be gone already
	if err := w.fsw.Add(w.dir); err != nil {
		w.log.Warn("rules: cannot watch the replaced rules directory; changes are seen at the next resync", "dir", w.dir, "err", err)
		return
	}
	w.dirInfo = fi
	w.log.Info("rules: the rules directory was replaced; watching the new one", "dir", w.dir)
}

// watchTableDirs adds the directory of every table file to the watch, so a
// table edit reloads the routes that read it.
func (w *Watcher) watchTableDirs() {
	for _, wf := range w.files {
		for _, t := range wf.tableFiles {
			d := filepath.Clean(filepath.Dir(t))
			if w.dirs[d] {
				continue
			}
			if err := w.fsw.Add(d); err != nil {
				w.log.Warn("rules: cannot watch table directory; edits to its tables need a reload (SIGHUP)", "dir", d, "err", err)
				continue
			}
			w.dirs[d] = true
		}
	}
}

func signature(routes []*Route, errs []error) string {
	var b strings.Builder
	for _, r := range routes {
		fmt.Fprintf(&b, "%s\x00%s\x00", r.File, r.Hash)
	}
	b.WriteString("\x01")
	for _, e := range errs {
		b.WriteString(e.Error())
		b.WriteByte(0)
	}
	return b.String()
}
