package state

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Rows is a table of rows a route keeps on disk: a topic table's copy of
// its topic, so that a table far larger than memory can be joined
// against. Its key range is
//
//	rows           route prefix | 't' | table id | row key   → row bytes
//
// Rows are outside checkpoints: the pipeline rebuilds a table from its
// topic whenever the route starts (Reset, then the topic from its start),
// so writes are not synced and a crash may lose the last ones. DropRoute
// deletes them with the route's other keys.
type Rows struct {
	db     *DB
	prefix []byte
}

const tagRows = 't'

// Rows is route's table named table.
func (db *DB) Rows(route, table string) *Rows {
	return &Rows{db: db, prefix: stepPrefix(route, tagRows, table)}
}

func (t *Rows) key(k []byte) []byte {
	return append(append(make([]byte, 0, len(t.prefix)+len(k)), t.prefix...), k...)
}

// Reset deletes every row.
func (t *Rows) Reset() error {
	if t.db.closed.Load() {
		return ErrClosed
	}
	return t.db.fatal.guard(func() error {
		return t.db.pdb.DeleteRange(t.prefix, prefixEnd(t.prefix), pebble.NoSync)
	})
}

// Get calls fn with the row of key, which is valid only during the call;
// ok is false when there is none.
func (t *Rows) Get(key []byte, fn func(val []byte)) (ok bool, err error) {
	if t.db.closed.Load() {
		return false, ErrClosed
	}
	v, closer, err := t.db.pdb.Get(t.key(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("state: table row: %w", err)
	}
	defer closer.Close()
	fn(v)
	return true, nil
}

// RowBatch is a set of row writes applied together.
type RowBatch struct {
	t *Rows
	b *pebble.Batch
}

// Batch starts a batch of row writes.
func (t *Rows) Batch() *RowBatch { return &RowBatch{t: t, b: t.db.pdb.NewBatch()} }

// Set writes the row of key.
func (b *RowBatch) Set(key, val []byte) error { return b.b.Set(b.t.key(key), val, nil) }

// Delete deletes the row of key.
func (b *RowBatch) Delete(key []byte) error { return b.b.Delete(b.t.key(key), nil) }

// Len is the number of writes in the batch.
func (b *RowBatch) Len() int { return int(b.b.Count()) }

// Close releases a batch without applying it.
func (b *RowBatch) Close() { b.b.Close() }

// Commit applies the batch (unsynced) and releases it.
func (b *RowBatch) Commit() error {
	defer b.b.Close()
	if b.t.db.closed.Load() {
		return ErrClosed
	}
	return b.t.db.fatal.guard(func() error { return b.b.Commit(pebble.NoSync) })
}
