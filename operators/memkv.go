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
// collector's scan: they are appended to byte chunks, and the ordered
// index is a btree of (chunk, offset, lengths) items with no pointers in
// them, so a collection cycle visits the btree's nodes (one per ~50
// keys), not every key. A chunk is never grown (an append to one slice
// would copy everything held at every growth, about seven bytes copied
// per byte written in the stream join's steady state) and never written
// over. Replaced and deleted entries stay in their chunk; a chunk none of
// whose entries is live any more is let go at once (state that expires
// oldest first, a join's buffers or drop_duplicates' keys, frees whole
// chunks and copies nothing), and when dead bytes are more than half of
// what the chunks hold, the live entries are copied into new chunks.
type MemKV struct {
	tree *btree.BTreeG[memItem]
	// chunks holds the entries, key then value; nil for a chunk let go,
	// whose index waits in free. live is, per chunk, the bytes of its
	// entries in the tree plus one per entry (an empty entry keeps its
	// chunk too). cur is the chunk appended to, last its capacity.
	chunks [][]byte
	live   []int
	free   []uint32
	cur    int
	last   int
	// used is the bytes written into the chunks held, dead the part of
	// them no entry in the tree stands for.
	used, dead int
	// compactions and released count copies and chunks let go (tests).
	compactions, released int
	// probe and from are the keys that the items with off probeOff and
	// fromOff stand for: the key a Get, Set or Delete searches for, and the
	// start of a Scan.
	probe, from []byte
}

// memItem is a key and its value in chunk off>>32 at offset uint32(off),
// the key first.
type memItem struct {
	off        uint64
	klen, vlen uint32
}

const (
	probeOff = ^uint64(0)
	fromOff  = ^uint64(1)
	// compactMin is the dead bytes below which nothing is copied.
	compactMin = 1 << 20
	// chunkMin and chunkMax bound a chunk's size: the first is small (most
	// MemKVs of tests hold little), each next one twice the last.
	chunkMin = 4 << 10
	chunkMax = 1 << 20
)

var _ KV = (*MemKV)(nil)

// NewMemKV returns an empty MemKV.
func NewMemKV() *MemKV {
	m := &MemKV{cur: -1}
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
	at := uint32(it.off)
	return m.chunks[it.off>>32][at : at+it.klen]
}

// val is the value of it, capped so that an append by the caller cannot
// write into the chunk.
func (m *MemKV) val(it memItem) []byte {
	at := uint32(it.off) + it.klen
	end := at + it.vlen
	return m.chunks[it.off>>32][at:end:end]
}

// Len is the number of live keys.
func (m *MemKV) Len() int { return m.tree.Len() }

// held is the bytes written into the chunks held (tests).
func (m *MemKV) held() int { return m.used }

// Get implements KV. The value stays valid after later calls: a chunk is
// only ever appended to or let go, never written over.
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
	it := m.place(key, val)
	if old, ok := m.tree.ReplaceOrInsert(it); ok {
		m.dropped(old)
	}
	return nil
}

// place appends key and val to the current chunk, or to a new one when
// they do not fit, and returns their item.
func (m *MemKV) place(key, val []byte) memItem {
	n := len(key) + len(val)
	if m.cur < 0 || cap(m.chunks[m.cur])-len(m.chunks[m.cur]) < n {
		m.newChunk(n)
	}
	c := m.chunks[m.cur]
	it := memItem{off: uint64(m.cur)<<32 | uint64(len(c)), klen: uint32(len(key)), vlen: uint32(len(val))}
	m.chunks[m.cur] = append(append(c, key...), val...)
	m.live[m.cur] += n + 1
	m.used += n
	return it
}

// newChunk makes a chunk of room for at least n bytes the current one.
func (m *MemKV) newChunk(n int) {
	if m.cur >= 0 && m.live[m.cur] == 0 {
		m.release(m.cur) // nothing in it is live
	}
	size := min(max(2*m.last, chunkMin), chunkMax)
	m.last = size
	c := make([]byte, 0, max(size, n))
	if k := len(m.free); k > 0 {
		m.cur = int(m.free[k-1])
		m.free = m.free[:k-1]
		m.chunks[m.cur], m.live[m.cur] = c, 0
		return
	}
	m.cur = len(m.chunks)
	m.chunks = append(m.chunks, c)
	m.live = append(m.live, 0)
}

// release lets chunk i go: no item of the tree is in it.
func (m *MemKV) release(i int) {
	m.used -= len(m.chunks[i])
	m.dead -= len(m.chunks[i])
	m.chunks[i] = nil
	m.free = append(m.free, uint32(i))
	m.released++
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

// dropped counts the bytes of an entry no longer in the tree, lets its
// chunk go when nothing in it is live, and copies the live entries into
// new chunks when dead bytes are more than half of what is held. (A
// Scan's callback must not modify the KV, so no Scan is running.)
func (m *MemKV) dropped(it memItem) {
	i, n := int(it.off>>32), int(it.klen)+int(it.vlen)
	m.dead += n
	if m.live[i] -= n + 1; m.live[i] == 0 && i != m.cur {
		m.release(i)
	}
	if m.dead < compactMin || 2*m.dead < m.used {
		return
	}
	old := m.chunks
	items := make([]memItem, 0, m.tree.Len())
	m.tree.Ascend(func(it memItem) bool {
		items = append(items, it)
		return true
	})
	m.chunks, m.live, m.free, m.cur, m.last, m.used, m.dead = nil, nil, nil, -1, 0, 0, 0
	for k, it := range items {
		at := uint32(it.off)
		c := old[it.off>>32]
		items[k] = m.place(c[at:at+it.klen], c[at+it.klen:at+it.klen+it.vlen])
	}
	m.tree = newMemTree(m)
	for _, it := range items {
		m.tree.ReplaceOrInsert(it)
	}
	m.compactions++
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
