package operators

// Step is one compiled step of a route. Process must never panic on bad
// input: a runtime failure becomes a dead letter with ReasonError.
type Step interface {
	// Kind is the step kind as written in the rule file: "filter", "set",
	// "map", "join", "drop_duplicates", "window".
	Kind() string
	Process(r *Record, out Emitter)
}

// Keyed is a stateful step whose state is partitioned by its own key
// expression. The pipeline writes each record to the step's repartition
// topic keyed by ShuffleKey(r), and the task owning that partition calls
// Process, so one key is only ever seen by one task in the deployment. A
// ShuffleKey error sends the record to the dead-letter topic.
type Keyed interface {
	Step
	ShuffleKey(r *Record) (string, error)
}

// Timed is a step that reacts to the route's watermark (windows close,
// ttl'd keys expire). The pipeline calls Advance whenever the watermark
// moves; watermark is epoch millis.
type Timed interface {
	Advance(watermark int64, out Emitter)
}

// Absorbing is a step that takes records into its state and emits later
// (a window): a Process that emits nothing is not counted as a drop.
type Absorbing interface {
	Absorbs()
}

// Closer is a Timed step that closes what it holds as the watermark passes
// and emits it then (a window). The pipeline's close journal covers it:
// before each Advance it asks ClosesAt, and when windows close it records,
// durably, the watermark and the source offsets applied so far; after a
// restore it hands that record back through Resume, so what closed before
// a crash stays closed (pipeline/journal.go).
type Closer interface {
	Timed
	// ClosesAt reports whether Advance(watermark) would close anything.
	ClosesAt(watermark int64) bool
	// Resume applies a close journal after Restore: the watermark becomes
	// max(restored, watermark), and applied is the highest source offset
	// per partition applied when it was written.
	Resume(watermark int64, applied map[int32]int64)
}

// Stateful is a step whose state must be part of a checkpoint. Snapshot
// writes the step's full state into w; Restore replaces the state with what
// r holds. Both are called with the step quiesced (no concurrent Process).
type Stateful interface {
	Snapshot(w Writer) error
	Restore(r Reader) error
}

// Table is what a broadcast join looks up. File tables and topic tables
// both implement it. Lookup must be safe for concurrent use.
type Table interface {
	Lookup(key string) (row map[string]any, ok bool)
}

// StateSizer is implemented by steps that can say cheaply how many keys
// their state holds (the rtproxy_state_keys gauge). A window counts its
// open (key, window) pairs. drop_duplicates does not implement it: its
// keys live in the KV, which knows its own size.
type StateSizer interface {
	StateKeys() int
}
