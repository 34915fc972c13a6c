package state

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/rtproxy/rtproxy/offsets"
)

// Frozen is a consistent cut of a route's keyed state: every write made
// to its namespaces before Freeze, and none made after. Readers keep seeing
// it (under newer writes) until Commit makes it durable.
type Frozen struct {
	db     *DB
	rs     *routeState
	layers map[*namespace]*overlay
	at     time.Time
	// discarded is set, under rs.mu, by DB.Discard.
	discarded bool
}

// Freeze cuts the route's state at this instant: it atomically swaps a
// fresh overlay into every namespace of the route, so processing can go on
// at once while the cut waits for its outputs to be acknowledged. The cut
// becomes durable with Frozen.Commit. Cuts of one route must be committed
// in the order they were frozen.
func (db *DB) Freeze(route string) (*Frozen, error) {
	return db.freeze(route, false)
}

func (db *DB) freeze(route string, alone bool) (*Frozen, error) {
	if db.closed.Load() {
		return nil, ErrClosed
	}
	rs, err := db.route(route)
	if err != nil {
		return nil, err
	}
	f := &Frozen{db: db, rs: rs, layers: make(map[*namespace]*overlay), at: time.Now()}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if alone && len(rs.mu.pending) > 0 {
		return nil, fmt.Errorf("state: checkpoint of route %q: %w", route, ErrCommitOrder)
	}
	// Holding every namespace lock at once makes the cut atomic across the
	// route's steps. Lock order: routeState.mu, then namespaces; nothing
	// takes them the other way round.
	nss := make([]*namespace, 0, len(rs.mu.namespaces))
	for _, ns := range rs.mu.namespaces {
		ns.mu.Lock()
		nss = append(nss, ns)
	}
	for _, ns := range nss {
		if ns.mu.active.len() > 0 {
			f.layers[ns] = ns.mu.active
			ns.mu.frozen = append(ns.mu.frozen, ns.mu.active)
			ns.mu.active = newOverlay()
		}
		ns.mu.Unlock()
	}
	rs.mu.pending = append(rs.mu.pending, f)
	return f, nil
}

// Writes is how many keyed-state writes (sets and deletes) the cut holds.
func (f *Frozen) Writes() int {
	n := 0
	for _, o := range f.layers {
		n += o.len()
	}
	return n
}

// Checkpoint is Freeze followed at once by Commit: one synced pebble batch
// with every write made to the route's namespaces before the call, the
// route's offsets, each given step snapshot and a checkpoint record. It
// fails with ErrCommitOrder, cutting nothing, while a Frozen cut of the
// route is pending.
func (db *DB) Checkpoint(route string, offs map[int32]int64, snaps map[string]func(Writer) error) error {
	f, err := db.freeze(route, true)
	if err != nil {
		return err
	}
	return f.Commit(offs, snaps)
}

// Commit writes the cut, offs (each partition's done offset, the position
// recovery resumes from) and snaps (each step's snapshot, replacing that
// step's previous one) together with a new checkpoint record in one synced
// pebble batch, then lets the cut's overlays go. If it fails, nothing was
// written and the cut stays pending: Commit may be called again.
func (f *Frozen) Commit(offs map[int32]int64, snaps map[string]func(Writer) error) error {
	db, rs := f.db, f.rs
	if db.closed.Load() {
		return ErrClosed
	}
	start := time.Now()
	rs.commitMu.Lock()
	defer rs.commitMu.Unlock()
	rs.mu.Lock()
	if f.discarded {
		rs.mu.Unlock()
		return fmt.Errorf("state: checkpoint of route %q: %w", rs.name, ErrDiscarded)
	}
	if len(rs.mu.pending) == 0 || rs.mu.pending[0] != f || rs.mu.dropped {
		rs.mu.Unlock()
		return fmt.Errorf("state: checkpoint of route %q: %w", rs.name, ErrCommitOrder)
	}
	seq := rs.mu.seq + 1
	rs.mu.Unlock()

	b := db.pdb.NewBatch()
	defer b.Close()
	metas, err := db.readMetas(db.pdb, rs.name)
	if err != nil {
		return err
	}
	touched := make(map[string]bool)
	writes := 0
	for ns, o := range f.layers {
		m := metas[ns.step]
		n, err := ns.writeLayer(b, o, &m)
		if err != nil {
			return err
		}
		writes += n
		metas[ns.step] = m
		touched[ns.step] = true
	}
	steps := make([]string, 0, len(snaps))
	for step := range snaps {
		steps = append(steps, step)
	}
	slices.Sort(steps)
	for _, step := range steps {
		p := stepPrefix(rs.name, tagSnapshot, step)
		if err := b.DeleteRange(p, prefixEnd(p), nil); err != nil {
			return err
		}
		w := &snapWriter{b: b, prefix: p}
		if err := snaps[step](w); err != nil {
			return fmt.Errorf("state: checkpoint of route %q: snapshot of step %q: %w", rs.name, step, err)
		}
		m := metas[step]
		m.snapKeys, m.snapBytes = w.keys, w.bytes
		metas[step] = m
		touched[step] = true
	}
	for step := range touched {
		if err := b.Set(stepPrefix(rs.name, tagMeta, step), metas[step].encode(), nil); err != nil {
			return err
		}
	}
	if err := b.Set(routeKey(rs.name, tagOffsets), offsets.Encode(nil, offs), nil); err != nil {
		return err
	}
	now := time.Now()
	if err := b.Set(routeKey(rs.name, tagCheckpoint), checkpointRecord{seq: seq, time: now}.encode(), nil); err != nil {
		return err
	}
	size := b.Len()
	if err := db.fatal.guard(func() error { return b.Commit(pebble.Sync) }); err != nil {
		return fmt.Errorf("state: checkpoint of route %q: %w", rs.name, err)
	}

	rs.mu.Lock()
	rs.mu.seq = seq
	// Clear the slot before reslicing: the backing array would otherwise
	// keep f, and with it the cut's overlays, alive until a later append
	// moves the array.
	rs.mu.pending[0] = nil
	rs.mu.pending = rs.mu.pending[1:]
	rs.mu.Unlock()
	for ns, o := range f.layers {
		ns.mu.Lock()
		// Invariant 2 makes o the oldest; search anyway so that a dropped
		// namespace (frozen list cleared) is handled.
		if i := slices.Index(ns.mu.frozen, o); i >= 0 {
			ns.mu.frozen = slices.Delete(ns.mu.frozen, i, i+1)
		}
		ns.mu.Unlock()
	}
	// The writes are in pebble now: a caller that keeps f (the pipeline's
	// pending list does, for a while) must not keep them in the heap.
	f.layers = nil
	db.log.Debug("checkpoint", "route", rs.name, "seq", seq, "writes", writes,
		"snapshots", len(snaps), "batch_bytes", size, "duration", time.Since(start),
		"cut_age", now.Sub(f.at))
	return nil
}

// writeLayer adds an overlay's writes to b and updates m's counts. Each
// key is looked up in pebble to count keys exactly; the overlay is sorted,
// so the seeks move forward through one iterator.
func (ns *namespace) writeLayer(b *pebble.Batch, o *overlay, m *stepMeta) (int, error) {
	it, err := ns.db.pdb.NewIter(&pebble.IterOptions{LowerBound: ns.prefix, UpperBound: ns.upper})
	if err != nil {
		return 0, ns.errorf("checkpoint", err)
	}
	defer it.Close()
	var (
		k      []byte
		werr   error
		writes int
	)
	o.tree.Ascend(func(e entry) bool {
		k = append(append(k[:0], ns.prefix...), e.key...)
		exists := it.SeekGE(k) && bytes.Equal(it.Key(), k)
		var old int
		if exists {
			old = len(e.key) + len(it.Value())
		}
		switch {
		case e.del && exists:
			m.kvKeys--
			m.kvBytes -= int64(old)
			werr = b.Delete(k, nil)
		case e.del:
			// Never reached pebble: nothing to delete.
			return true
		default:
			if !exists {
				m.kvKeys++
			}
			m.kvBytes += int64(len(e.key)+len(e.val)) - int64(old)
			werr = b.Set(k, e.val, nil)
		}
		writes++
		return werr == nil
	})
	if werr == nil {
		werr = it.Error()
	}
	if werr != nil {
		return 0, ns.errorf("checkpoint", werr)
	}
	return writes, nil
}

// snapWriter writes one step's snapshot into the checkpoint batch.
type snapWriter struct {
	b           *pebble.Batch
	prefix, k   []byte
	keys, bytes int64
}

func (w *snapWriter) Put(key, val []byte) error {
	w.k = append(append(w.k[:0], w.prefix...), key...)
	w.keys++
	w.bytes += int64(len(key) + len(val))
	return w.b.Set(w.k, val, nil)
}

// Checkpoint is the last checkpoint of a route, as LoadCheckpoint found it.
type Checkpoint struct {
	Route string
	// Offsets is each partition's done offset: where to resume reading.
	Offsets map[int32]int64
	Time    time.Time
	Seq     uint64

	db *DB
}

// LoadCheckpoint reads the route's last checkpoint; ok is false when the
// route has none (start from source.start). The route's keyed state needs
// no restoring: its namespaces read the checkpointed state directly.
func (db *DB) LoadCheckpoint(route string) (*Checkpoint, bool, error) {
	if db.closed.Load() {
		return nil, false, ErrClosed
	}
	rec, ok, err := db.readCheckpointRecord(route)
	if err != nil || !ok {
		return nil, false, err
	}
	v, closer, err := db.pdb.Get(routeKey(route, tagOffsets))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, fmt.Errorf("state: route %q: %w: checkpoint %d has no offsets", route, ErrCorrupt, rec.seq)
	}
	if err != nil {
		return nil, false, fmt.Errorf("state: route %q: %w", route, err)
	}
	offs, err := offsets.Decode(v)
	closer.Close()
	if err != nil {
		return nil, false, fmt.Errorf("state: route %q checkpoint %d: %w", route, rec.seq, err)
	}
	return &Checkpoint{Route: route, Offsets: offs, Time: rec.time, Seq: rec.seq, db: db}, true, nil
}

// Snapshot returns the snapshot the checkpoint holds for step (empty if
// none), for operators.Stateful.Restore. Each reads the database when it
// runs, so restore before the route writes its next checkpoint.
func (cp *Checkpoint) Snapshot(step string) Reader {
	return snapReader{db: cp.db, route: cp.Route, step: step}
}

type snapReader struct {
	db          *DB
	route, step string
}

// Each calls fn for every entry of the snapshot in key order. key and val
// are valid only during the call.
func (r snapReader) Each(fn func(key, val []byte) error) error {
	if r.db.closed.Load() {
		return ErrClosed
	}
	p := stepPrefix(r.route, tagSnapshot, r.step)
	it, err := r.db.pdb.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		return fmt.Errorf("state: route %q step %q: snapshot: %w", r.route, r.step, err)
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		if err := fn(it.Key()[len(p):], it.Value()); err != nil {
			return err
		}
	}
	return it.Error()
}
