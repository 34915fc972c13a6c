package operators

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
)

// arenaTable is a read-only join table laid out for the garbage collector:
// every row is encoded (rowcodec.go) into one []byte, and the index is an
// open-addressing hash table of uint64 pairs. Neither holds a pointer, so
// the collector never scans them, however many rows there are; what it
// does scan is the constants (at most maxConsts boxed values). A table of
// Go maps costs a collection cycle a visit to every map, string and box of
// every row instead.
//
// Lookup decodes the row into a new map each time, so rows handed to two
// records are never the same map. Hash collisions are resolved by
// comparing the key bytes. Safe for concurrent use: nothing changes after
// the builder finished it.
type arenaTable struct {
	seed maphash.Seed
	// arena is the rows, one record after the other: uvarint key length,
	// key, uvarint row length, row.
	arena []byte
	// slots is pairs (hash of the key, offset of its record + 1); an
	// offset of 0 is an empty slot. len(slots)/2 is a power of two.
	slots  []uint64
	n      int
	consts []any
}

// arenaBuilder fills an arenaTable row by row; a later row with the same
// key replaces the earlier one.
type arenaBuilder struct {
	t    *arenaTable
	enc  *rowEncoder
	row  []byte
	dead int // bytes of replaced records
}

func newArenaBuilder() *arenaBuilder {
	t := &arenaTable{seed: maphash.MakeSeed(), slots: make([]uint64, 2*64)}
	return &arenaBuilder{t: t, enc: newRowEncoder()}
}

// add stores row under key.
func (b *arenaBuilder) add(key string, row map[string]any) error {
	var err error
	if b.row, err = b.enc.appendValue(b.row[:0], row, 0); err != nil {
		return err
	}
	t := b.t
	off := len(t.arena)
	t.arena = binary.AppendUvarint(t.arena, uint64(len(key)))
	t.arena = append(t.arena, key...)
	t.arena = binary.AppendUvarint(t.arena, uint64(len(b.row)))
	t.arena = append(t.arena, b.row...)

	h := maphash.String(t.seed, key)
	i, found := t.find(h, key)
	if found {
		old := int(t.slots[2*i+1] - 1)
		b.dead += t.recordEnd(old) - old
		t.slots[2*i+1] = uint64(off) + 1
		return nil
	}
	t.slots[2*i], t.slots[2*i+1] = h, uint64(off)+1
	t.n++
	if 2*t.n > len(t.slots)/2 { // keep the load at most 1/2
		t.grow()
	}
	return nil
}

// finish returns the table, its arena compacted when replaced rows left
// more than a quarter of it unused, and trimmed to its length.
func (b *arenaBuilder) finish() *arenaTable {
	t := b.t
	t.consts = b.enc.consts
	if b.dead > 0 && 4*b.dead > len(t.arena) {
		arena := make([]byte, 0, len(t.arena)-b.dead)
		for i := 1; i < len(t.slots); i += 2 {
			if t.slots[i] == 0 {
				continue
			}
			off := int(t.slots[i] - 1)
			t.slots[i] = uint64(len(arena)) + 1
			arena = append(arena, t.arena[off:t.recordEnd(off)]...)
		}
		t.arena = arena
	} else if cap(t.arena) > len(t.arena) {
		t.arena = append(make([]byte, 0, len(t.arena)), t.arena...)
	}
	b.t = nil
	return t
}

// find returns the slot of key: where it is (found) or the empty slot
// where it would go.
func (t *arenaTable) find(h uint64, key string) (int, bool) {
	mask := len(t.slots)/2 - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		off := t.slots[2*i+1]
		if off == 0 {
			return i, false
		}
		if t.slots[2*i] == h && string(t.keyAt(int(off-1))) == key {
			return i, true
		}
	}
}

// keyAt is the key of the record at off.
func (t *arenaTable) keyAt(off int) []byte {
	n, w := binary.Uvarint(t.arena[off:])
	return t.arena[off+w : off+w+int(n)]
}

// rowAt is the encoded row of the record at off.
func (t *arenaTable) rowAt(off int) []byte {
	n, w := binary.Uvarint(t.arena[off:])
	off += w + int(n)
	n, w = binary.Uvarint(t.arena[off:])
	return t.arena[off+w : off+w+int(n)]
}

// recordEnd is the offset just past the record at off.
func (t *arenaTable) recordEnd(off int) int {
	n, w := binary.Uvarint(t.arena[off:])
	off += w + int(n)
	n, w = binary.Uvarint(t.arena[off:])
	return off + w + int(n)
}

func (t *arenaTable) grow() {
	old := t.slots
	t.slots = make([]uint64, 2*len(old))
	mask := len(t.slots)/2 - 1
	for i := 0; i < len(old); i += 2 {
		if old[i+1] == 0 {
			continue
		}
		j := int(old[i]) & mask
		for t.slots[2*j+1] != 0 {
			j = (j + 1) & mask
		}
		t.slots[2*j], t.slots[2*j+1] = old[i], old[i+1]
	}
}

// Len is the number of rows.
func (t *arenaTable) Len() int { return t.n }

// Lookup returns a newly decoded copy of the row of key.
func (t *arenaTable) Lookup(key string) (map[string]any, bool) {
	i, found := t.find(maphash.String(t.seed, key), key)
	if !found {
		return nil, false
	}
	v, err := decodeRow(t.rowAt(int(t.slots[2*i+1]-1)), t.consts)
	if err != nil {
		// The table encoded the row itself: this is a bug, and the join
		// dead-letters the record with it.
		panic(fmt.Sprintf("table row of key %q: %v", key, err))
	}
	return v.(map[string]any), true
}

// bytes is the memory the table holds outside its constants.
func (t *arenaTable) bytes() int { return cap(t.arena) + 8*cap(t.slots) }
