// Package state is rtproxy's keyed state over pebble: namespaced by route
// and step, written together with the route's offsets in one atomic batch
// at each checkpoint, restored on start.
//
// It must never import pipeline/, operators/ or protocol/.
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
