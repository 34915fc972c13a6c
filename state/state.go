// Package state is rtproxy's keyed state over pebble: namespaced by route
// and step, written together with the route's offsets in one atomic batch
// at each checkpoint, restored on start.
//
// One DB (Open) serves the whole process. Each step of each route gets a KV
// (DB.Namespace). A KV's writes are readable at once but live only in an
// in-memory overlay until the route's next checkpoint, which writes every
// overlay of the route, the route's offsets, step snapshots and a
// checkpoint record in one synced pebble batch. A crash therefore rolls the
// state back to exactly the last checkpoint, matching the offsets that
// replay resumes from. Overlays hold only the writes since the last
// checkpoint, so state far larger than memory lives in pebble.
//
// To keep a checkpoint from stalling its route, DB.Freeze cuts the state
// at a consistent point in O(number of steps) and processing continues;
// Frozen.Commit writes the cut once the outputs before it are acknowledged.
// DB.Checkpoint does both at once. DB.Discard drops what no checkpoint
// committed (pending cuts and overlays), for a route that stopped without
// its final checkpoint and will replay from the last one.
//
// Outside the checkpoints, DB.PutDurable keeps one small record per step
// in a synced write of its own, which no crash rolls back (the pipeline's
// window close journal).
//
// The byte layout of every key and record is at the top of layout.go.
//
// It imports pebble and offsets/ (for the offsets encoding) and must never
// import pipeline/, operators/ or protocol/.
package state

// KV is one namespace of keyed state (one step of one route). Reads see
// every write made through the same KV, whether or not it has been
// checkpointed yet. Writes become durable only with the next checkpoint, so
// a crash rolls state back to exactly the last checkpoint.
//
// Keys and values passed in may be reused by the caller after the call
// returns; the KV copies what it keeps. A returned value is valid only until
// the next call on the KV.
type KV interface {
	Get(key []byte) (val []byte, ok bool, err error)
	Set(key, val []byte) error
	Delete(key []byte) error
	// Scan calls fn for every live key in [start, end) in key order (end nil:
	// to the end of the namespace). fn must not modify the KV; returning
	// false stops the scan.
	Scan(start, end []byte, fn func(key, val []byte) bool) error
}

// Writer receives a step's snapshot (operators.Stateful).
type Writer interface {
	Put(key, val []byte) error
}

// Reader hands a snapshot back on restore.
type Reader interface {
	Each(fn func(key, val []byte) error) error
}
