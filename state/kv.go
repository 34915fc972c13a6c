package state

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// namespace is the KV of one step of one route. Reads look through three
// layers, newest first:
//
//	active  – writes since the last freeze (mutable)
//	frozen  – cuts taken by Freeze, not yet committed (immutable), newest first
//	pebble  – what the last committed checkpoint left
//
// Invariants:
//  1. A frozen overlay leaves the list only after its batch is committed
//     to pebble, so a key is always visible in some layer.
//  2. Frozen overlays are committed oldest first (Frozen.Commit checks),
//     so pebble never holds a write newer than one still in an overlay.
//  3. Nothing but a checkpoint commit writes a namespace's keys to pebble;
//     closing or crashing drops the overlays, which is the rollback.
type namespace struct {
	db     *DB
	route  string
	step   string
	prefix []byte // stepPrefix(route, 'k', step)
	upper  []byte // prefixEnd(prefix)

	mu struct {
		sync.RWMutex
		active  *overlay
		frozen  []*overlay // oldest first
		dropped bool
	}
}

func newNamespace(db *DB, route, step string) *namespace {
	ns := &namespace{db: db, route: route, step: step, prefix: stepPrefix(route, tagKV, step)}
	ns.upper = prefixEnd(ns.prefix)
	ns.mu.active = newOverlay()
	return ns
}

var keyBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 128); return &b }}

func (ns *namespace) errorf(op string, err error) error {
	return fmt.Errorf("state: route %q step %q: %s: %w", ns.route, ns.step, op, err)
}

// Get returns the value of key. The returned slice is never modified by
// the KV, so it stays valid even after later calls.
func (ns *namespace) Get(key []byte) ([]byte, bool, error) {
	if ns.db.closed.Load() {
		return nil, false, ErrClosed
	}
	ns.mu.RLock()
	if ns.mu.dropped {
		ns.mu.RUnlock()
		return nil, false, ns.errorf("get", ErrDropped)
	}
	if e, ok := ns.mu.active.get(key); ok {
		ns.mu.RUnlock()
		return e.val, !e.del, nil
	}
	for i := len(ns.mu.frozen) - 1; i >= 0; i-- {
		if e, ok := ns.mu.frozen[i].get(key); ok {
			ns.mu.RUnlock()
			return e.val, !e.del, nil
		}
	}
	ns.mu.RUnlock()
	// Reading pebble outside the lock is safe: a frozen overlay that we
	// did not find the key in cannot change it (invariant 1), and one
	// committed since we looked is already in pebble.
	bp := keyBufPool.Get().(*[]byte)
	k := append(append((*bp)[:0], ns.prefix...), key...)
	v, closer, err := ns.db.pdb.Get(k)
	*bp = k
	keyBufPool.Put(bp)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, ns.errorf("get", err)
	}
	val := append([]byte(nil), v...)
	closer.Close()
	return val, true, nil
}

// Set writes key=val, readable at once, durable at the next checkpoint.
func (ns *namespace) Set(key, val []byte) error {
	if ns.db.closed.Load() {
		return ErrClosed
	}
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.mu.dropped {
		return ns.errorf("set", ErrDropped)
	}
	ns.mu.active.set(key, val)
	return nil
}

// Delete removes key, at once for readers, durably at the next checkpoint.
func (ns *namespace) Delete(key []byte) error {
	if ns.db.closed.Load() {
		return ErrClosed
	}
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.mu.dropped {
		return ns.errorf("delete", ErrDropped)
	}
	ns.mu.active.del(key)
	return nil
}

// scanCopyMax is how many entries of an overlay a Scan copies out under
// the lock; a range with more is read through a clone.
const scanCopyMax = 16

// layer is an overlay as one Scan reads it: the entries of the range
// copied out (all of them: o is nil), or the overlay itself (a clone of the
// active one, or a frozen one, which never changes).
type layer struct {
	o       *overlay
	entries []entry
}

// Scan merges the layers in key order. It sees the overlays and a pebble
// iterator as they were under one lock, so it sees one consistent state
// and fn may call the KV (even write to it) without deadlock; such writes
// are not seen by the scan in progress. An overlay's entries in the range
// are copied out when there are at most scanCopyMax of them (an entry's
// bytes are never modified, so the copy is the entry headers); only a
// longer range of the active overlay is read through a copy-on-write
// clone. A clone per Scan made the next write after it copy every btree
// node on its path (a stream join scans before each write: 16% of its
// profile).
func (ns *namespace) Scan(start, end []byte, fn func(key, val []byte) bool) error {
	if ns.db.closed.Load() {
		return ErrClosed
	}
	if end != nil && bytes.Compare(start, end) >= 0 {
		return nil
	}
	lower := append(append([]byte(nil), ns.prefix...), start...)
	upper := ns.upper
	if end != nil {
		upper = append(append([]byte(nil), ns.prefix...), end...)
	}
	ns.mu.Lock()
	if ns.mu.dropped {
		ns.mu.Unlock()
		return ns.errorf("scan", ErrDropped)
	}
	layers := make([]layer, 0, 1+len(ns.mu.frozen))
	if ns.mu.active.len() > 0 {
		if es, all := ns.mu.active.copyRange(start, end, scanCopyMax); all {
			layers = append(layers, layer{entries: es})
		} else {
			layers = append(layers, layer{o: ns.mu.active.clone()})
		}
	}
	for i := len(ns.mu.frozen) - 1; i >= 0; i-- {
		if es, all := ns.mu.frozen[i].copyRange(start, end, scanCopyMax); all {
			layers = append(layers, layer{entries: es})
		} else {
			layers = append(layers, layer{o: ns.mu.frozen[i]})
		}
	}
	it, err := ns.db.pdb.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	ns.mu.Unlock()
	if err != nil {
		return ns.errorf("scan", err)
	}
	return ns.merge(layers, start, end, it, fn)
}

// source is one layer positioned at its current entry.
type source struct {
	// overlay layers
	next  func() (entry, bool)
	stop  func()
	cur   entry
	valid bool
	// the pebble layer
	it     *pebble.Iterator
	prefix int
}

func (s *source) key() []byte {
	if s.it != nil {
		return s.it.Key()[s.prefix:]
	}
	return s.cur.key
}

func (s *source) advance() {
	if s.it != nil {
		s.valid = s.it.Next()
		return
	}
	s.cur, s.valid = s.next()
}

// merge walks layers (highest precedence first) and the pebble iterator,
// yielding for each key the newest layer's version unless it is a
// tombstone.
func (ns *namespace) merge(layers []layer, start, end []byte, it *pebble.Iterator, fn func(key, val []byte) bool) (err error) {
	srcs := make([]source, 0, len(layers)+1)
	defer func() {
		for i := range srcs {
			if srcs[i].stop != nil {
				srcs[i].stop()
			}
		}
		if cerr := it.Close(); cerr != nil && err == nil {
			err = ns.errorf("scan", cerr)
		}
	}()
	for _, l := range layers {
		var s source
		if l.o != nil {
			s.next, s.stop = iter.Pull(l.o.rangeSeq(start, end))
		} else {
			es := l.entries
			s.next = func() (entry, bool) {
				if len(es) == 0 {
					return entry{}, false
				}
				e := es[0]
				es = es[1:]
				return e, true
			}
		}
		s.cur, s.valid = s.next()
		srcs = append(srcs, s)
	}
	srcs = append(srcs, source{it: it, prefix: len(ns.prefix), valid: it.First()})
	var same [8]int
	for {
		win := -1
		var min []byte
		for i := range srcs {
			if !srcs[i].valid {
				continue
			}
			// Strictly less: on equal keys the earlier (newer) layer wins.
			if k := srcs[i].key(); win < 0 || bytes.Compare(k, min) < 0 {
				win, min = i, k
			}
		}
		if win < 0 {
			return it.Error()
		}
		eq := same[:0]
		for i := range srcs {
			if srcs[i].valid && (i == win || bytes.Equal(srcs[i].key(), min)) {
				eq = append(eq, i)
			}
		}
		w := &srcs[win]
		if w.it != nil {
			if !fn(min, w.it.Value()) {
				return nil
			}
		} else if !w.cur.del {
			if !fn(min, w.cur.val) {
				return nil
			}
		}
		for _, i := range eq {
			srcs[i].advance()
		}
	}
}

// pendingBytes is what the overlays hold.
func (ns *namespace) pendingBytes() int64 {
	ns.mu.RLock()
	defer ns.mu.RUnlock()
	n := ns.mu.active.bytes
	for _, o := range ns.mu.frozen {
		n += o.bytes
	}
	return n
}

// drop detaches the namespace: its overlays are discarded and every later
// call returns ErrDropped.
func (ns *namespace) drop() {
	ns.mu.Lock()
	ns.mu.dropped = true
	ns.mu.active = newOverlay()
	ns.mu.frozen = nil
	ns.mu.Unlock()
}
