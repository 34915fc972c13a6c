package state

import (
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// EachWrite calls fn for every keyed-state write the cut holds, namespace
// by namespace (step is the namespace's step name) and in key order within
// one: a set (del false) or a delete. The pipeline logs them to a changelog
// topic before the cut commits. key and val are valid only during the call.
func (f *Frozen) EachWrite(fn func(step string, key, val []byte, del bool) error) error {
	for ns, o := range f.layers {
		var err error
		o.tree.Ascend(func(e entry) bool {
			err = fn(ns.step, e.key, e.val, e.del)
			return err == nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// SnapshotReader reads the snapshot that pebble holds for step of route,
// as the last checkpoint (or ReplaceStep) left it.
func (db *DB) SnapshotReader(route, step string) Reader {
	return snapReader{db: db, route: route, step: step}
}

// ReplaceStep makes kv and snap the whole committed state of step: every
// keyed-state, snapshot and meta key of the step is deleted and the given
// entries are written, in one synced pebble batch, and the step's
// namespace is detached (a KV handed out before returns ErrDropped;
// Namespace hands out a fresh one that reads the new state). The
// pipeline rebuilds a partition's state from its changelog with it, before
// anything processes that partition. The step's durable record is kept.
func (db *DB) ReplaceStep(route, step string, kv, snap map[string][]byte) error {
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
	b := db.pdb.NewBatch()
	defer b.Close()
	for _, t := range []byte{tagMeta, tagKV, tagSnapshot} {
		p := stepPrefix(route, t, step)
		if err := b.DeleteRange(p, prefixEnd(p), nil); err != nil {
			return err
		}
	}
	var m stepMeta
	write := func(t byte, entries map[string][]byte, keys, bytes *int64) error {
		p := stepPrefix(route, t, step)
		ks := make([]string, 0, len(entries))
		for k := range entries {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		var full []byte
		for _, k := range ks {
			full = append(append(full[:0], p...), k...)
			v := entries[k]
			if err := b.Set(full, v, nil); err != nil {
				return err
			}
			*keys++
			*bytes += int64(len(k) + len(v))
		}
		return nil
	}
	if err := write(tagKV, kv, &m.kvKeys, &m.kvBytes); err != nil {
		return err
	}
	if err := write(tagSnapshot, snap, &m.snapKeys, &m.snapBytes); err != nil {
		return err
	}
	if err := b.Set(stepPrefix(route, tagMeta, step), m.encode(), nil); err != nil {
		return err
	}
	if err := db.fatal.guard(func() error { return b.Commit(pebble.Sync) }); err != nil {
		return fmt.Errorf("state: route %q step %q: replace: %w", route, step, err)
	}
	if ns, ok := rs.mu.namespaces[step]; ok {
		ns.drop()
		delete(rs.mu.namespaces, step)
	}
	return nil
}
