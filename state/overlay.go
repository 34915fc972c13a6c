package state

import (
	"bytes"
	"iter"

	"github.com/google/btree"
)

// entry is one uncommitted write: a value, or a tombstone (del) that hides
// the key in every layer below. key and val share one allocation and are
// never modified after insertion, so readers may keep them.
type entry struct {
	key []byte
	val []byte
	del bool
}

func lessEntry(a, b entry) bool { return bytes.Compare(a.key, b.key) < 0 }

// overlay is the writes of one namespace since its last freeze, sorted by
// key so that Scan can merge it with the layers below. Not safe for
// concurrent use on its own; the namespace's lock guards it.
type overlay struct {
	tree *btree.BTreeG[entry]
	// bytes is the key and value bytes held, for PendingBytes.
	bytes int64
}

// btreeDegree 32 keeps nodes around two cache-line-sized pages of entries;
// google/btree's own benchmarks favour 16–64.
const btreeDegree = 32

func newOverlay() *overlay {
	return &overlay{tree: btree.NewG(btreeDegree, lessEntry)}
}

func (o *overlay) len() int { return o.tree.Len() }

func (o *overlay) get(key []byte) (entry, bool) {
	return o.tree.Get(entry{key: key})
}

func (o *overlay) set(key, val []byte) {
	// One allocation holds both; the caller may reuse its slices.
	buf := make([]byte, len(key)+len(val))
	copy(buf, key)
	copy(buf[len(key):], val)
	o.put(entry{key: buf[:len(key):len(key)], val: buf[len(key):]})
}

func (o *overlay) del(key []byte) {
	o.put(entry{key: append([]byte(nil), key...), del: true})
}

func (o *overlay) put(e entry) {
	if old, ok := o.tree.ReplaceOrInsert(e); ok {
		o.bytes -= int64(len(old.key) + len(old.val))
	}
	o.bytes += int64(len(e.key) + len(e.val))
}

// clone returns a copy-on-write copy: O(1) now, and later writes to either
// side copy only the nodes they touch.
func (o *overlay) clone() *overlay {
	return &overlay{tree: o.tree.Clone(), bytes: o.bytes}
}

// copyRange returns the entries in [start, end) (end nil: no bound) when
// there are at most max of them (all true); otherwise all is false.
func (o *overlay) copyRange(start, end []byte, max int) (es []entry, all bool) {
	all = true
	visit := func(e entry) bool {
		if len(es) == max {
			all = false
			return false
		}
		es = append(es, e)
		return true
	}
	if end == nil {
		o.tree.AscendGreaterOrEqual(entry{key: start}, visit)
	} else {
		o.tree.AscendRange(entry{key: start}, entry{key: end}, visit)
	}
	if !all {
		return nil, false
	}
	return es, true
}

// rangeSeq yields entries in [start, end) in key order (end nil: no bound).
func (o *overlay) rangeSeq(start, end []byte) iter.Seq[entry] {
	return func(yield func(entry) bool) {
		visit := func(e entry) bool { return yield(e) }
		switch {
		case end == nil:
			o.tree.AscendGreaterOrEqual(entry{key: start}, visit)
		default:
			o.tree.AscendRange(entry{key: start}, entry{key: end}, visit)
		}
	}
}
