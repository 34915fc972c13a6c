package state

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Sentinel errors callers branch on.
var (
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("state: database closed")
	// ErrDropped is returned by a KV whose step or route was dropped.
	ErrDropped = errors.New("state: namespace dropped")
	// ErrFrozenPending is returned by DropRoute and DropStepsExcept while a
	// Frozen cut of the route is not yet committed.
	ErrFrozenPending = errors.New("state: a frozen checkpoint of the route is pending")
	// ErrCommitOrder is returned by Frozen.Commit when an earlier Frozen of
	// the same route is still pending, or this one was already committed.
	ErrCommitOrder = errors.New("state: frozen checkpoints must be committed once, in the order they were frozen")
	// ErrDiscarded is returned by Frozen.Commit for a cut that DB.Discard
	// dropped.
	ErrDiscarded = errors.New("state: frozen checkpoint was discarded")
	// ErrOldFormat is returned by Open for a state directory written by
	// pebble v1 (rtproxy before its move to pebble v2) at an on-disk format
	// pebble v2 cannot read. The error says what to do.
	ErrOldFormat = errors.New("state: the state directory was written by an earlier rtproxy (pebble v1) in an on-disk format this build cannot read")
)

// storeFormat is the pebble format major version a new state directory is
// created at, and the one an older directory is ratcheted to when opened
// (pebble does that itself, in place, and it cannot be undone). Pebble v2
// opens directories from FormatFlushableIngest on; pebble v1 wrote
// rtproxy's at its default, FormatMostCompatible, which needs the upgrade
// oldFormatError describes. Raise it deliberately, never by following
// pebble.FormatNewest: a raised format cannot be read by a build before.
const storeFormat = pebble.FormatValueSeparation

// Options tunes the pebble database. The zero value means every default.
type Options struct {
	// CacheBytes is pebble's block cache. Default 64 MiB: enough to keep
	// index and filter blocks of tens of millions of keys hot, while the
	// process stays within a few hundred MiB.
	CacheBytes int64
	// MemTableBytes is the size of one memtable. Default 16 MiB; at most
	// four are queued before writes stall, bounding memtable memory at
	// 64 MiB.
	MemTableBytes uint64
	// FS is the file system pebble writes to; nil is the operating
	// system's. Tests use it to inject disk errors.
	FS vfs.FS
}

func (o Options) withDefaults() Options {
	if o.CacheBytes == 0 {
		o.CacheBytes = 64 << 20
	}
	if o.MemTableBytes == 0 {
		o.MemTableBytes = 16 << 20
	}
	return o
}

// DB is the process's one state database under --state-dir. It is safe for
// concurrent use.
type DB struct {
	pdb    *pebble.DB
	log    *slog.Logger
	closed atomic.Bool
	fatal  *fatalGuard

	mu struct {
		sync.Mutex
		routes map[string]*routeState
	}
}

// routeState is the in-memory side of one route: its namespaces (with
// their uncommitted overlays) and its pending frozen cuts.
type routeState struct {
	name string

	// commitMu serialises everything that writes the route's keys in
	// pebble: Frozen.Commit, DropRoute, DropStepsExcept.
	commitMu sync.Mutex

	mu struct {
		sync.Mutex
		namespaces map[string]*namespace
		// pending holds frozen cuts not yet committed, oldest first.
		pending []*Frozen
		// seq is the sequence number of the last checkpoint written.
		seq     uint64
		dropped bool
	}
}

// Open opens (creating if needed) the state database in dir with default
// Options. Pebble's own log lines go to log.
func Open(dir string, log *slog.Logger) (*DB, error) {
	return OpenWithOptions(dir, log, Options{})
}

// OpenWithOptions is Open with tuning.
func OpenWithOptions(dir string, log *slog.Logger, o Options) (*DB, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	o = o.withDefaults()
	cache := pebble.NewCache(o.CacheBytes)
	defer cache.Unref() // the DB holds its own reference
	fatal := &fatalGuard{log: log}
	popts := &pebble.Options{
		Cache:                       cache,
		MemTableSize:                o.MemTableBytes,
		MemTableStopWritesThreshold: 4,
		Logger:                      fatal,
		FS:                          o.FS,
		FormatMajorVersion:          storeFormat,
	}
	// No 100ms poll of the compaction scheduler at rest (sched.go).
	popts.Experimental.CompactionScheduler = newQuietScheduler()
	if popts.FS == nil {
		// The operating system's file system without pebble's disk-health
		// wrapper (Options.WithFSDefaults): it ticks every 2 s per open
		// WAL and manifest, and once more for the file system, to report
		// slow writes to EventListener.DiskSlow, which rtproxy leaves
		// unset (pebble's default does nothing with them). At rest those
		// tickers were a third of an idle sidecar's wake-ups
		// (docs/BENCHMARKS.md, "Footprint"). A disk that fails shows as a
		// failed write (fatal.go) all the same.
		popts.FS = vfs.Default
	}
	popts.EnsureDefaults()
	if err := checkOldFormat(popts.FS, dir); err != nil {
		return nil, err
	}
	for i := range popts.Levels {
		// drop_duplicates looks up mostly absent keys: a bloom filter
		// answers those without reading data blocks.
		popts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	var pdb *pebble.DB
	err := fatal.guard(func() (err error) {
		pdb, err = pebble.Open(dir, popts)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("state: open %s: %w", dir, err)
	}
	db := &DB{pdb: pdb, log: log, fatal: fatal}
	db.mu.routes = make(map[string]*routeState)
	if err := db.checkFormat(); err != nil {
		pdb.Close()
		return nil, fmt.Errorf("state: open %s: %w", dir, err)
	}
	return db, nil
}

// checkOldFormat refuses, before pebble touches it, a directory pebble v2
// cannot open: one written by pebble v1 at a format major version before
// pebble.FormatMinSupported. FormatMostCompatible (pebble v1's default, so
// every rtproxy state directory from before pebble v2) has a CURRENT file
// and no format-version marker; later versions name theirs in the marker
// file "marker.format-version.<seq>.<version>".
func checkOldFormat(fs vfs.FS, dir string) error {
	names, err := fs.List(dir)
	if err != nil {
		return nil // absent: pebble creates it, or says why it cannot
	}
	current, vers := false, -1
	for _, name := range names {
		if name == "CURRENT" {
			current = true
		}
		if rest, ok := strings.CutPrefix(name, "marker.format-version."); ok {
			if i := strings.LastIndexByte(rest, '.'); i >= 0 {
				if v, err := strconv.Atoi(rest[i+1:]); err == nil {
					vers = v
				}
			}
		}
	}
	switch {
	case vers < 0 && current:
		return oldFormatError(dir, 1)
	case vers >= 0 && vers < int(pebble.FormatMinSupported):
		return oldFormatError(dir, vers)
	}
	return nil
}

func oldFormatError(dir string, vers int) error {
	return fmt.Errorf("%w: %s is at pebble format major version %d, this build reads %d and later. "+
		"It is a cache of what the routes keep in Kafka. With the proxy stopped, either upgrade it in place once, "+
		"keeping everything (back it up first), by running \"echo y | go run github.com/cockroachdb/pebble/cmd/pebble@v1.1.5 db upgrade %s\"; "+
		"or move it aside and start with an empty one: each route restores its keyed state from its changelog topics "+
		"and resumes from its group's offsets, but gets a new exactly-once transactional id, "+
		"and the state kept for routes whose rule file was deleted is gone (docs/OPERATIONS.md, \"State directory\")",
		ErrOldFormat, dir, vers, pebble.FormatMinSupported, dir)
}

func (db *DB) checkFormat() error {
	v, closer, err := db.pdb.Get(formatKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return db.fatal.guard(func() error { return db.pdb.Set(formatKey, []byte{formatVersion}, pebble.Sync) })
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	if len(v) != 1 || v[0] != formatVersion {
		return fmt.Errorf("%w: format version %x, this build reads %d", ErrCorrupt, v, formatVersion)
	}
	return nil
}

// Close closes the database. Writes not yet checkpointed are discarded:
// reopening yields exactly the last checkpoint of every route. Close waits
// for commits in progress; the routes' readers and writers must have
// stopped, as pebble does not allow reads during its close.
func (db *DB) Close() error {
	if db.closed.Swap(true) {
		return ErrClosed
	}
	db.mu.Lock()
	routes := make([]*routeState, 0, len(db.mu.routes))
	for _, rs := range db.mu.routes {
		routes = append(routes, rs)
	}
	db.mu.Unlock()
	for _, rs := range routes {
		rs.commitMu.Lock()
		defer rs.commitMu.Unlock()
	}
	if err := db.fatal.err(); err != nil {
		// Pebble's commit pipeline is unusable, and a goroutine of its own
		// may be parked holding its locks: closing could hang. What is on
		// disk is the last checkpoint.
		return err
	}
	return db.pdb.Close()
}

// Broken is nil, or ErrBroken with pebble's message once the database has
// failed (see ErrBroken).
func (db *DB) Broken() error { return db.fatal.err() }

// OnBroken sets fn to be called once, when the database breaks, whatever
// was writing then (a checkpoint, a drop, a route's setup, pebble itself).
// fn must not block or use the database. If it is broken already, fn is
// called now.
func (db *DB) OnBroken(fn func(error)) {
	db.fatal.onBroken.Store(&fn)
	if err := db.fatal.err(); err != nil {
		fn(err)
	}
}

// route returns the in-memory state of route, loading its last sequence
// number on first use.
func (db *DB) route(name string) (*routeState, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if rs := db.mu.routes[name]; rs != nil {
		return rs, nil
	}
	rs := &routeState{name: name}
	rs.mu.namespaces = make(map[string]*namespace)
	rec, ok, err := db.readCheckpointRecord(name)
	if err != nil {
		return nil, err
	}
	if ok {
		rs.mu.seq = rec.seq
	}
	db.mu.routes[name] = rs
	return rs, nil
}

func (db *DB) readCheckpointRecord(route string) (checkpointRecord, bool, error) {
	v, closer, err := db.pdb.Get(routeKey(route, tagCheckpoint))
	if errors.Is(err, pebble.ErrNotFound) {
		return checkpointRecord{}, false, nil
	}
	if err != nil {
		return checkpointRecord{}, false, fmt.Errorf("state: route %q: %w", route, err)
	}
	defer closer.Close()
	rec, err := decodeCheckpointRecord(v)
	if err != nil {
		return checkpointRecord{}, false, fmt.Errorf("state: route %q: %w", route, err)
	}
	return rec, true, nil
}

// Namespace returns the keyed state of one step of one route. The step
// name should carry the step's fingerprint (e.g. "3-window-1a2b3c4d") so
// that a changed step gets a fresh namespace. Calling it again with the
// same names returns the same KV.
func (db *DB) Namespace(route, step string) KV {
	rs, err := db.route(route)
	if err != nil {
		return errKV{err}
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	ns := rs.mu.namespaces[step]
	if ns == nil {
		ns = newNamespace(db, route, step)
		rs.mu.namespaces[step] = ns
	}
	return ns
}

// errKV reports the error that kept a namespace from opening on every
// call, so that it is not lost.
type errKV struct{ err error }

func (e errKV) Get([]byte) ([]byte, bool, error)                 { return nil, false, e.err }
func (e errKV) Set(_, _ []byte) error                            { return e.err }
func (e errKV) Delete([]byte) error                              { return e.err }
func (e errKV) Scan(_, _ []byte, _ func(k, v []byte) bool) error { return e.err }

// RouteInfo describes one route that has state.
type RouteInfo struct {
	Route string
	// LastCheckpoint is zero and Seq 0 when the route has keys but no
	// checkpoint record.
	LastCheckpoint time.Time
	Seq            uint64
	// Keys and Bytes count keyed-state and snapshot entries (key plus value
	// bytes) as of the last checkpoint.
	Keys, Bytes int64
	// Steps lists the steps with state, sorted.
	Steps []StepInfo
}

// StepInfo is the state of one step as of the last checkpoint.
type StepInfo struct {
	Step                string
	KVKeys, KVBytes     int64
	SnapKeys, SnapBytes int64
}

// Routes lists every route with state in the database, sorted by name.
func (db *DB) Routes() ([]RouteInfo, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	it, err := db.pdb.NewIter(&pebble.IterOptions{
		LowerBound: []byte{tagRoute},
		UpperBound: []byte{tagRoute + 1},
	})
	if err != nil {
		return nil, fmt.Errorf("state: list routes: %w", err)
	}
	var names []string
	for valid := it.First(); valid; {
		route, n, err := parseRoutePrefix(it.Key())
		if err != nil {
			it.Close()
			return nil, err
		}
		names = append(names, route)
		valid = it.SeekGE(prefixEnd(it.Key()[:n]))
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("state: list routes: %w", err)
	}
	infos := make([]RouteInfo, 0, len(names))
	for _, name := range names {
		info, err := db.routeInfo(name)
		if err != nil {
			return nil, err
		}
		infos = append(infos, info)
	}
	return infos, nil
}

func (db *DB) routeInfo(route string) (RouteInfo, error) {
	info := RouteInfo{Route: route}
	rec, ok, err := db.readCheckpointRecord(route)
	if err != nil {
		return info, err
	}
	if ok {
		info.LastCheckpoint, info.Seq = rec.time, rec.seq
	}
	metas, err := db.readMetas(db.pdb, route)
	if err != nil {
		return info, err
	}
	for step, m := range metas {
		info.Steps = append(info.Steps, StepInfo{Step: step, KVKeys: m.kvKeys, KVBytes: m.kvBytes, SnapKeys: m.snapKeys, SnapBytes: m.snapBytes})
		info.Keys += m.kvKeys + m.snapKeys
		info.Bytes += m.kvBytes + m.snapBytes
	}
	slices.SortFunc(info.Steps, func(a, b StepInfo) int { return compareStrings(a.Step, b.Step) })
	return info, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Stats returns the route's keys and bytes (keyed state plus snapshots,
// key plus value bytes) as of its last checkpoint; 0, 0 on error.
func (db *DB) Stats(route string) (keys, bytes int64) {
	if db.closed.Load() {
		return 0, 0
	}
	info, err := db.routeInfo(route)
	if err != nil {
		db.log.Warn("state stats", "route", route, "err", err)
		return 0, 0
	}
	return info.Keys, info.Bytes
}

// StepStats returns each step's counts as of the route's last checkpoint,
// for rtproxy_state_keys{route,step}.
func (db *DB) StepStats(route string) ([]StepInfo, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	info, err := db.routeInfo(route)
	return info.Steps, err
}

// PendingBytes is the key and value bytes written to the route's
// namespaces and not yet committed (live and frozen overlays): what the
// next checkpoints will write, and roughly the memory they hold.
func (db *DB) PendingBytes(route string) int64 {
	db.mu.Lock()
	rs := db.mu.routes[route]
	db.mu.Unlock()
	if rs == nil {
		return 0
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var n int64
	for _, ns := range rs.mu.namespaces {
		n += ns.pendingBytes()
	}
	return n
}

type pebbleReader interface {
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}

// readMetas reads every step meta record of route.
func (db *DB) readMetas(r pebbleReader, route string) (map[string]stepMeta, error) {
	lo := append(routePrefix(route), tagMeta)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(lo)})
	if err != nil {
		return nil, fmt.Errorf("state: route %q: %w", route, err)
	}
	defer it.Close()
	metas := make(map[string]stepMeta)
	for valid := it.First(); valid; valid = it.Next() {
		step, _, err := parseStepID(it.Key()[len(lo):])
		if err != nil {
			return nil, fmt.Errorf("state: route %q: %w", route, err)
		}
		m, err := decodeStepMeta(it.Value())
		if err != nil {
			return nil, fmt.Errorf("state: route %q step %q: %w", route, step, err)
		}
		metas[step] = m
	}
	return metas, it.Error()
}

// stepsWithState lists the steps that have keys under tag t of route.
func (db *DB) stepsWithState(route string, t byte) ([]string, error) {
	lo := append(routePrefix(route), t)
	it, err := db.pdb.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(lo)})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var steps []string
	for valid := it.First(); valid; {
		step, n, err := parseStepID(it.Key()[len(lo):])
		if err != nil {
			return nil, fmt.Errorf("state: route %q: %w", route, err)
		}
		steps = append(steps, step)
		valid = it.SeekGE(prefixEnd(it.Key()[:len(lo)+n]))
	}
	return steps, it.Error()
}

// PutDurable replaces step's durable record of route with val, in a synced
// pebble write of its own: durable when it returns, whatever happens to
// checkpoints later (a crash does not roll it back, Discard keeps it).
// It is for small records written rarely (a sync costs milliseconds);
// keyed state belongs in a KV. DropRoute and DropStepsExcept delete it.
func (db *DB) PutDurable(route, step string, val []byte) error {
	if db.closed.Load() {
		return ErrClosed
	}
	if err := db.fatal.guard(func() error { return db.pdb.Set(stepPrefix(route, tagDurable, step), val, pebble.Sync) }); err != nil {
		return fmt.Errorf("state: route %q step %q: put durable: %w", route, step, err)
	}
	return nil
}

// GetDurable returns step's durable record of route (a copy), ok false
// when there is none.
func (db *DB) GetDurable(route, step string) (val []byte, ok bool, err error) {
	if db.closed.Load() {
		return nil, false, ErrClosed
	}
	v, closer, err := db.pdb.Get(stepPrefix(route, tagDurable, step))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("state: route %q step %q: get durable: %w", route, step, err)
	}
	defer closer.Close()
	return append([]byte(nil), v...), true, nil
}

// DropRoute deletes all of a route's state, durably, and detaches its
// namespaces (their KVs return ErrDropped from then on). It fails with
// ErrFrozenPending while a Frozen cut of the route is uncommitted.
func (db *DB) DropRoute(route string) error {
	if db.closed.Load() {
		return ErrClosed
	}
	rs, err := db.route(route)
	if err != nil {
		return err
	}
	rs.commitMu.Lock()
	defer rs.commitMu.Unlock()
	rs.mu.Lock()
	if len(rs.mu.pending) > 0 {
		rs.mu.Unlock()
		return fmt.Errorf("state: drop route %q: %w", route, ErrFrozenPending)
	}
	p := routePrefix(route)
	if err := db.fatal.guard(func() error { return db.pdb.DeleteRange(p, prefixEnd(p), pebble.Sync) }); err != nil {
		rs.mu.Unlock()
		return fmt.Errorf("state: drop route %q: %w", route, err)
	}
	for _, ns := range rs.mu.namespaces {
		ns.drop()
	}
	rs.mu.dropped = true
	rs.mu.Unlock()
	db.mu.Lock()
	delete(db.mu.routes, route)
	db.mu.Unlock()
	db.log.Info("state dropped", "route", route)
	return nil
}

// DropStepsExcept deletes, durably, the keyed state, snapshot and meta of
// every step of route not named in keep (steps whose fingerprint changed,
// or that were removed), and detaches their namespaces. The route's
// offsets and checkpoint record stay. It fails with ErrFrozenPending while
// a Frozen cut of the route is uncommitted.
func (db *DB) DropStepsExcept(route string, keep []string) error {
	if db.closed.Load() {
		return ErrClosed
	}
	rs, err := db.route(route)
	if err != nil {
		return err
	}
	rs.commitMu.Lock()
	defer rs.commitMu.Unlock()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.mu.pending) > 0 {
		return fmt.Errorf("state: drop steps of route %q: %w", route, ErrFrozenPending)
	}
	b := db.pdb.NewBatch()
	defer b.Close()
	var dropped []string
	seen := make(map[string]bool)
	for _, t := range []byte{tagMeta, tagKV, tagSnapshot, tagDurable} {
		steps, err := db.stepsWithState(route, t)
		if err != nil {
			return fmt.Errorf("state: drop steps of route %q: %w", route, err)
		}
		for _, step := range steps {
			if slices.Contains(keep, step) {
				continue
			}
			p := stepPrefix(route, t, step)
			if err := b.DeleteRange(p, prefixEnd(p), nil); err != nil {
				return err
			}
			if !seen[step] {
				seen[step] = true
				dropped = append(dropped, step)
			}
		}
	}
	for step, ns := range rs.mu.namespaces {
		if !slices.Contains(keep, step) {
			ns.drop()
			delete(rs.mu.namespaces, step)
			if !seen[step] {
				seen[step] = true
				dropped = append(dropped, step)
			}
		}
	}
	if err := db.fatal.guard(func() error { return b.Commit(pebble.Sync) }); err != nil {
		return fmt.Errorf("state: drop steps of route %q: %w", route, err)
	}
	if len(dropped) > 0 {
		slices.Sort(dropped)
		db.log.Info("state steps dropped", "route", route, "steps", dropped)
	}
	return nil
}

// Discard drops every write of route that no checkpoint has committed: its
// pending frozen cuts (their Commit then fails with ErrDiscarded) and the
// live overlays of all its namespaces. The namespaces are detached, so a
// KV handed out before returns ErrDropped, while Namespace hands out fresh
// ones that read exactly the last committed checkpoint, the state that
// matches LoadCheckpoint's offsets. A route whose stop gave up on its final
// checkpoint calls it so that the next run replays from that checkpoint
// rather than building on state past it, and so that DropRoute and
// DropStepsExcept are no longer refused with ErrFrozenPending. It returns
// how many frozen cuts and how many key and value bytes it dropped.
func (db *DB) Discard(route string) (cuts int, bytes int64, err error) {
	if db.closed.Load() {
		return 0, 0, ErrClosed
	}
	rs, err := db.route(route)
	if err != nil {
		return 0, 0, err
	}
	// commitMu: no Commit of a cut being discarded is half way through.
	rs.commitMu.Lock()
	defer rs.commitMu.Unlock()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	cuts = len(rs.mu.pending)
	for _, f := range rs.mu.pending {
		f.discarded = true
	}
	rs.mu.pending = nil
	for step, ns := range rs.mu.namespaces {
		bytes += ns.pendingBytes()
		ns.drop()
		delete(rs.mu.namespaces, step)
	}
	if cuts > 0 || bytes > 0 {
		db.log.Info("state uncommitted writes discarded", "route", route, "frozen_cuts", cuts, "bytes", bytes, "seq", rs.mu.seq)
	}
	return cuts, bytes, nil
}

// Memory is what pebble holds in memory for every route together: its
// block cache (filled by reads of keyed state, up to CacheBytes) and its
// memtables (256 KiB at first, growing with writes up to MemTableBytes
// each). A closed DB holds none.
func (db *DB) Memory() (cache, memtables int64) {
	if db.closed.Load() {
		return 0, 0
	}
	m := db.pdb.Metrics()
	return m.BlockCache.Size, int64(m.MemTable.Size + m.MemTable.ZombieSize)
}
