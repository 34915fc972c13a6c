package operators

import (
	"bytes"

	"github.com/google/btree"

	"github.com/rtproxy/rtproxy/state"
)

// MemKV is an in-memory, ordered state.KV for tests and benchmarks, and
// the state of a drop_duplicates step built without a KV. It is not safe
// for concurrent use (a Keyed step is only ever driven by one worker) and
// it is not durable: only the pebble-backed KV of package state survives a
// restart.
type MemKV struct {
	tree *btree.BTreeG[memItem]
}

type memItem struct{ key, val []byte }

var _ state.KV = (*MemKV)(nil)

// NewMemKV returns an empty MemKV.
func NewMemKV() *MemKV {
	return &MemKV{tree: btree.NewG(32, func(a, b memItem) bool { return bytes.Compare(a.key, b.key) < 0 })}
}

// Len is the number of live keys.
func (m *MemKV) Len() int { return m.tree.Len() }

// Get implements state.KV.
func (m *MemKV) Get(key []byte) ([]byte, bool, error) {
	it, ok := m.tree.Get(memItem{key: key})
	return it.val, ok, nil
}

// Set implements state.KV; it copies key and val.
func (m *MemKV) Set(key, val []byte) error {
	m.tree.ReplaceOrInsert(memItem{key: bytes.Clone(key), val: append([]byte{}, val...)})
	return nil
}

// Delete implements state.KV.
func (m *MemKV) Delete(key []byte) error {
	m.tree.Delete(memItem{key: key})
	return nil
}

// Scan implements state.KV.
func (m *MemKV) Scan(start, end []byte, fn func(key, val []byte) bool) error {
	m.tree.AscendGreaterOrEqual(memItem{key: start}, func(it memItem) bool {
		if end != nil && bytes.Compare(it.key, end) >= 0 {
			return false
		}
		return fn(it.key, it.val)
	})
	return nil
}
