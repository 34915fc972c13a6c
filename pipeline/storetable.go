package pipeline

import (
	"container/list"
	"fmt"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/state"
)

// tableCacheRows is how many rows of a topic table are kept decoded in
// memory, most recently used first; the table itself lives in the state
// store (docs/RULES.md, Tables).
const tableCacheRows = 1 << 16

// storeTable is a topic table kept in the state store (state.Rows), so
// its size is bounded by the disk rather than the heap, with the most
// recently looked-up rows (and misses) decoded in an LRU cache. Lookup is
// safe for concurrent use; apply is called by the table's one reader.
type storeTable struct {
	rows *state.Rows
	max  int

	mu    sync.Mutex
	ver   uint64 // bumped by every applied batch: a read older than it is not cached
	lru   *list.List
	cache map[string]*list.Element
}

type cachedRow struct {
	key string
	row map[string]any
	ok  bool
}

func newStoreTable(rows *state.Rows, max int) *storeTable {
	return &storeTable{rows: rows, max: max, lru: list.New(), cache: map[string]*list.Element{}}
}

// Lookup implements operators.Table. A row that cannot be read is not
// found; the reader reported rows that did not decode when it applied them.
func (t *storeTable) Lookup(key string) (map[string]any, bool) {
	t.mu.Lock()
	if e, ok := t.cache[key]; ok {
		t.lru.MoveToFront(e)
		c := e.Value.(*cachedRow)
		t.mu.Unlock()
		return c.row, c.ok
	}
	ver := t.ver
	t.mu.Unlock()

	var row map[string]any
	found, err := t.rows.Get([]byte(key), func(v []byte) {
		if d, derr := jsoncodec.Decode(v); derr == nil {
			row, _ = d.(map[string]any)
		}
	})
	ok := err == nil && found && row != nil

	if err == nil {
		// A read that failed is not remembered as a miss: the next
		// lookup reads again.
		t.mu.Lock()
		if t.ver == ver {
			t.putLocked(key, row, ok)
		}
		t.mu.Unlock()
	}
	return row, ok
}

func (t *storeTable) putLocked(key string, row map[string]any, ok bool) {
	if e, present := t.cache[key]; present {
		c := e.Value.(*cachedRow)
		c.row, c.ok = row, ok
		t.lru.MoveToFront(e)
		return
	}
	// The key is often a view into the whole input of the record that
	// looked it up (a string of a value decoded whole): kept as it is, it
	// would keep that record's bytes alive as long as the row is cached.
	key = strings.Clone(key)
	t.cache[key] = t.lru.PushFront(&cachedRow{key: key, row: row, ok: ok})
	for t.lru.Len() > t.max {
		last := t.lru.Back()
		delete(t.cache, last.Value.(*cachedRow).key)
		t.lru.Remove(last)
	}
}

// apply writes a fetch's records in one batch: a tombstone deletes its
// row, anything else must be a JSON object (others are reported through
// skipped and left out). Control records are skipped.
func (t *storeTable) apply(recs []*kgo.Record, skipped func(*kgo.Record, error)) error {
	b := t.rows.Batch()
	type change struct {
		key string
		row map[string]any
	}
	var changes []change
	for _, rec := range recs {
		if rec.Attrs.IsControl() {
			continue
		}
		key := string(rec.Key)
		if rec.Value == nil {
			if err := b.Delete(rec.Key); err != nil {
				b.Close()
				return err
			}
			changes = append(changes, change{key: key})
			continue
		}
		v, err := jsoncodec.Decode(rec.Value)
		if err != nil {
			skipped(rec, err)
			continue
		}
		row, ok := v.(map[string]any)
		if !ok {
			skipped(rec, fmt.Errorf("row is %T, not a JSON object", v))
			continue
		}
		if err := b.Set(rec.Key, rec.Value); err != nil {
			b.Close()
			return err
		}
		changes = append(changes, change{key, row})
	}
	if b.Len() == 0 {
		b.Close()
		return nil
	}
	if err := b.Commit(); err != nil {
		return err
	}
	t.mu.Lock()
	t.ver++
	for _, c := range changes {
		if _, cached := t.cache[c.key]; cached {
			t.putLocked(c.key, c.row, c.row != nil)
		}
	}
	t.mu.Unlock()
	return nil
}
