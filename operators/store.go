package operators

// What a step needs of a store, declared where it is used: state's
// namespaces (state.DB.Namespace), snapshot writers and readers satisfy these
// interfaces, and MemKV does for tests and benchmarks. Declaring them here
// keeps operators a package of pure steps that imports no store (and links
// no pebble into rules and rtproxy check).

// KV is one namespace of keyed state (one step of one route). Reads see
// every write made through the same KV; writes become durable only with the
// next checkpoint. Keys and values passed in may be reused by the caller
// after the call; a returned value is valid only until the next call.
type KV interface {
	Get(key []byte) (val []byte, ok bool, err error)
	Set(key, val []byte) error
	Delete(key []byte) error
	// Scan calls fn for every live key in [start, end) in key order (end
	// nil: to the end of the namespace); returning false stops the scan.
	Scan(start, end []byte, fn func(key, val []byte) bool) error
}

// Writer receives a step's snapshot (Stateful).
type Writer interface {
	Put(key, val []byte) error
}

// Reader hands a snapshot back on restore.
type Reader interface {
	Each(fn func(key, val []byte) error) error
}
