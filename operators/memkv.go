package operators

import (
	"bytes"

	"github.com/google/btree"
)

// MemKV is an in-memory, ordered KV for tests and benchmarks, and
// the state of a drop_duplicates step built without a KV. It is not safe
// for concurrent use (a Keyed step instance is only ever driven by one task) and
// it is not durable: only the pebble-backed KV of package state survives a
// restart.
//
// Like pebble's memtable it keeps its keys and values out of the garbage
// collector's scan: they are appended to one byte arena, and the ordered
// index is a btree of (offset, lengths) items with no pointers in them,
// so a collection cycle visits the btree's nodes (one per ~50 keys), not
// every key. Replaced and deleted entries stay in the arena until they
// are more than half of it; then it is copied without them.
type MemKV struct {
	tree  *btree.BTreeG[memItem]
	arena []byte
	dead  int
	// probe and from are the keys that the items with off probeOff and
	// fromOff stand for: the key a Get, Set or Delete searches for, and the
	// start of a Scan.
	probe, from []byte
}

// memItem is a key and its value at arena[off:], the key first.
type memItem struct {
	off        uint64
	klen, vlen uint32
}

const (
	probeOff = ^uint64(0)
	fromOff  = ^uint64(1)
	// compactMin is the arena size below which dead entries are left alone.
	compactMin = 1 << 20
)

var _ KV = (*MemKV)(nil)

// NewMemKV returns an empty MemKV.
func NewMemKV() *MemKV {
	m := &MemKV{}
	m.tree = newMemTree(m)
	return m
}

func newMemTree(m *MemKV) *btree.BTreeG[memItem] {
	return btree.NewG(32, func(a, b memItem) bool { return bytes.Compare(m.key(a), m.key(b)) < 0 })
}

func (m *MemKV) key(it memItem) []byte {
	switch it.off {
	case probeOff:
		return m.probe
	case fromOff:
		return m.from
	}
	return m.arena[it.off : it.off+uint64(it.klen)]
}

// val is the value of it, capped so that an append by the caller cannot
// write into the arena.
func (m *MemKV) val(it memItem) []byte {
	at := it.off + uint64(it.klen)
	return m.arena[at : at+uint64(it.vlen) : at+uint64(it.vlen)]
}

// Len is the number of live keys.
func (m *MemKV) Len() int { return m.tree.Len() }

// Get implements KV. The value stays valid after later calls: the
// arena is only ever appended to or replaced, never written over.
func (m *MemKV) Get(key []byte) ([]byte, bool, error) {
	m.probe = key
	it, ok := m.tree.Get(memItem{off: probeOff})
	m.probe = nil
	if !ok {
		return nil, false, nil
	}
	return m.val(it), true, nil
}

// Set implements KV; it copies key and val.
func (m *MemKV) Set(key, val []byte) error {
	it := memItem{off: uint64(len(m.arena)), klen: uint32(len(key)), vlen: uint32(len(val))}
	m.arena = append(append(m.arena, key...), val...)
	if old, ok := m.tree.ReplaceOrInsert(it); ok {
		m.dropped(old)
	}
	return nil
}

// Delete implements KV.
func (m *MemKV) Delete(key []byte) error {
	m.probe = key
	old, ok := m.tree.Delete(memItem{off: probeOff})
	m.probe = nil
	if ok {
		m.dropped(old)
	}
	return nil
}

// dropped counts the bytes of an entry no longer in the tree and copies
// the arena when more than half of it is such bytes. (A Scan's callback
// must not modify the KV, so no Scan is running.)
func (m *MemKV) dropped(it memItem) {
	m.dead += int(it.klen) + int(it.vlen)
	if m.dead < compactMin || 2*m.dead < len(m.arena) {
		return
	}
	items := make([]memItem, 0, m.tree.Len())
	arena := make([]byte, 0, len(m.arena)-m.dead)
	m.tree.Ascend(func(it memItem) bool {
		at := len(arena)
		arena = append(arena, m.arena[it.off:it.off+uint64(it.klen)+uint64(it.vlen)]...)
		it.off = uint64(at)
		items = append(items, it)
		return true
	})
	m.arena, m.dead = arena, 0
	m.tree = newMemTree(m)
	for _, it := range items {
		m.tree.ReplaceOrInsert(it)
	}
}

// Scan implements KV.
func (m *MemKV) Scan(start, end []byte, fn func(key, val []byte) bool) error {
	prev := m.from
	m.from = start
	defer func() { m.from = prev }() // a callback's Get may Scan too
	m.tree.AscendGreaterOrEqual(memItem{off: fromOff}, func(it memItem) bool {
		k := m.key(it)
		if end != nil && bytes.Compare(k, end) >= 0 {
			return false
		}
		return fn(k[:len(k):len(k)], m.val(it))
	})
	return nil
}
