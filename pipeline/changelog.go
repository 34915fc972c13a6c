package pipeline

// Changelog. Each keyed step logs its state to a compacted topic,
// <route>.<NN>-<kind>.changelog, partition q holding the state of the
// step's task for repartition partition q. A record's key is a tag and a
// key, its value the value (nil: deleted), and its rtproxy-step header the
// full step name (fingerprint included, so a restore skips what an edited
// step's earlier version wrote):
//
//	'k' | user key        the step's keyed state (state.KV)
//	's' | snapshot key    the step's snapshot (operators.Stateful)
//	'i' | writer (4 B)    the task's inbox: highest origin applied per writer
//	'j'                   the window close journal (journal.go)
//	'r' | bound (8 B)     a fence: what lies in [bound, this record's offset)
//	                      was logged by an owner whose checkpoint never
//	                      committed, and is not part of the state
//
// The valid history of partition q is [0, E) minus every fenced range, E
// being the end offset in the group commit's metadata. A journal record
// counts wherever it is: it is written only after the rows of the windows
// it closes were acknowledged, so it is never rolled back.

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	clKV      = 'k'
	clSnap    = 's'
	clInbox   = 'i'
	clJournal = 'j'
	clFence   = 'r'

	headerStepName = "rtproxy-step-state"

	// clLive leads every changelog value that is not a tombstone.
	clLive = 1
)

// clValue decodes a changelog record's value: live false for a tombstone.
func clValue(rec *kgo.Record) (val []byte, live bool) {
	if len(rec.Value) == 0 || rec.Value[0] != clLive {
		return nil, false
	}
	return rec.Value[1:], true
}

func encodeInboxEntry(p int32, o origin) (k, v []byte) {
	k = binary.BigEndian.AppendUint32(nil, uint32(p))
	v = binary.AppendVarint(nil, o.off)
	v = binary.AppendUvarint(v, uint64(o.seq))
	return k, v
}

func decodeInboxEntry(k, v []byte) (int32, origin, error) {
	if len(k) != 4 {
		return 0, origin{}, fmt.Errorf("inbox key %x", k)
	}
	off, n := binary.Varint(v)
	if n <= 0 {
		return 0, origin{}, fmt.Errorf("inbox value %x", v)
	}
	seq, m := binary.Uvarint(v[n:])
	if m <= 0 || n+m != len(v) || seq > 1<<32-1 {
		return 0, origin{}, fmt.Errorf("inbox value %x", v)
	}
	return int32(binary.BigEndian.Uint32(k)), origin{off: off, seq: uint32(seq)}, nil
}

// inboxSnapshot copies t's inbox for a cut.
func (t *task) inboxSnapshot() *memSnapshot {
	ms := &memSnapshot{}
	ps := slices.Sorted(maps.Keys(t.inbox))
	for _, p := range ps {
		k, v := encodeInboxEntry(p, t.inbox[p])
		_ = ms.Put(k, v)
	}
	return ms
}

func hashValue(v []byte) uint64 {
	h := fnv.New64a()
	h.Write(v)
	return h.Sum64() | 1 // never 0: 0 is "absent"
}

// clRecord is a live changelog record for tag and key. Its value, empty or
// nil included (a drop_duplicates key keeps none), is stored behind the
// byte clLive, so that it never reads back as a tombstone (Kafka and its
// clients need not tell a null value from an empty one). key and val are
// copied.
func (r *route) clRecord(t *task, tag byte, key, val []byte) *kgo.Record {
	rec := r.clTombstone(t, tag, key)
	rec.Value = append(append(make([]byte, 0, 1+len(val)), clLive), val...)
	return rec
}

// clTombstone is the changelog record that deletes tag and key.
func (r *route) clTombstone(t *task, tag byte, key []byte) *kgo.Record {
	k := append(append(make([]byte, 0, 1+len(key)), tag), key...)
	return &kgo.Record{Topic: t.seg.changelog, Partition: t.part, Key: k,
		Headers: []kgo.RecordHeader{{Key: headerStepName, Value: []byte(t.stepName)}}}
}

// logChanges writes what the cut changed in each keyed task's state to the
// task's changelog partition and waits for the acknowledgement; it then
// sets each keyed task's changelog end in the cut's offsets. Snapshots are
// logged as a diff against what the changelog already holds. The tasks
// learn what was logged (their diff base and changelog end) when the
// returned apply runs: at once for an at-least-once route, once the
// transaction committed for an exactly-once one.
func (r *route) logChanges(c *cutPoint) (apply func(), err error) {
	byName := map[string]*task{}
	for _, t := range c.tasks {
		if t.seg.keyed() {
			byName[t.stepName] = t
		}
	}
	if len(byName) == 0 {
		return func() {}, nil
	}
	var recs []*kgo.Record
	err = c.frozen.EachWrite(func(step string, key, val []byte, del bool) error {
		t := byName[step]
		if t == nil {
			return nil
		}
		if del {
			recs = append(recs, r.clTombstone(t, clKV, key))
		} else {
			recs = append(recs, r.clRecord(t, clKV, key, val))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	next := map[*task]map[string]uint64{}
	for _, t := range byName {
		cur := map[string]uint64{}
		for _, part := range []struct {
			tag byte
			ms  *memSnapshot
		}{{clSnap, c.snaps[t.stepName]}, {clInbox, c.snaps[t.inboxName]}} {
			if part.ms == nil {
				continue
			}
			for i := 0; i+1 < len(part.ms.kv); i += 2 {
				k, v := part.ms.kv[i], part.ms.kv[i+1]
				full := string(append([]byte{part.tag}, k...))
				h := hashValue(v)
				cur[full] = h
				if t.prevSnap[full] != h {
					recs = append(recs, r.clRecord(t, part.tag, k, v))
				}
			}
		}
		for full := range t.prevSnap {
			if _, ok := cur[full]; !ok {
				recs = append(recs, r.clTombstone(t, full[0], []byte(full[1:])))
			}
		}
		next[t] = cur
	}
	ends, err := r.produceChangelog(recs)
	if err != nil {
		return nil, err
	}
	for t := range next {
		c.offs[changelogID(t.seg.idx, t.part)] = max(t.clEnd, ends[t.seg.changelog][t.part])
	}
	return func() {
		for t, cur := range next {
			t.prevSnap = cur
			t.clEnd = c.offs[changelogID(t.seg.idx, t.part)]
		}
	}, nil
}

// produceChangelog writes recs and waits for every acknowledgement. It
// returns the end offset it reached in each (topic, partition).
func (r *route) produceChangelog(recs []*kgo.Record) (map[string]map[int32]int64, error) {
	ends := map[string]map[int32]int64{}
	if len(recs) == 0 {
		return ends, nil
	}
	results, err := r.wr.changelog(r.out.ctx, recs, true)
	if err != nil {
		return nil, fmt.Errorf("changelog: %w", err)
	}
	for _, res := range results {
		if res.Err != nil {
			return nil, fmt.Errorf("changelog %s[%d]: %w", res.Record.Topic, res.Record.Partition, res.Err)
		}
		if ends[res.Record.Topic] == nil {
			ends[res.Record.Topic] = map[int32]int64{}
		}
		ends[res.Record.Topic][res.Record.Partition] = max(ends[res.Record.Topic][res.Record.Partition], res.Record.Offset+1)
	}
	return ends, nil
}

// tasksSnapshot returns the owned tasks.
func (r *route) tasksSnapshot() []*task {
	r.tm.mu.Lock()
	defer r.tm.mu.Unlock()
	var out []*task
	for _, m := range r.tm.byTopic {
		for _, t := range m {
			out = append(out, t)
		}
	}
	return out
}

// prepareState makes a newly assigned keyed task's state ready (group.go's
// invariants 2 and 3), then builds its steps on it.
func (r *route) prepareState(ctx context.Context, t *task, c committed, hasCommit bool, last map[int32]int64) error {
	bound, hasBound := parseCommitMeta(c.meta)
	localPos, hasLocal := last[t.id]
	localCl, hasLocalCl := last[changelogID(t.seg.idx, t.part)]
	fenceAt := int64(0)
	dump := false
	switch {
	case hasCommit && hasLocal && hasLocalCl && hasBound && localPos == c.off && localCl == bound:
		fenceAt = bound
		r.log.Debug("local state matches the group's checkpoint", "task", t.label)
	case hasCommit:
		if !hasBound {
			bound = 0 // committed without a changelog: no state logged yet
		}
		if err := r.restoreFromChangelog(ctx, t, bound); err != nil {
			return err
		}
		fenceAt = bound
	case hasLocal:
		// The group has no offsets (a first run in a group): the local
		// checkpoint is the truth, and the changelog learns all of it.
		dump = true
	default:
		for _, n := range []string{t.stepName, t.inboxName} {
			if err := r.m.store().ReplaceStep(r.name, n, nil, nil); err != nil {
				return err
			}
		}
	}
	if err := r.buildTaskChain(t); err != nil {
		return err
	}
	recs := []*kgo.Record{r.clRecord(t, clFence, binary.BigEndian.AppendUint64(nil, uint64(fenceAt)),
		binary.BigEndian.AppendUint64(nil, uint64(fenceAt)))}
	prev := map[string]uint64{}
	add := func(tag byte, name string, log bool) error {
		return r.m.store().SnapshotReader(r.name, name).Each(func(k, v []byte) error {
			prev[string(append([]byte{tag}, k...))] = hashValue(v)
			if log {
				recs = append(recs, r.clRecord(t, tag, k, v))
			}
			return nil
		})
	}
	if err := add(clSnap, t.stepName, dump); err != nil {
		return err
	}
	if err := add(clInbox, t.inboxName, dump); err != nil {
		return err
	}
	if dump {
		err := r.m.store().Namespace(r.name, t.stepName).Scan(nil, nil, func(k, v []byte) bool {
			recs = append(recs, r.clRecord(t, clKV, k, v))
			return true
		})
		if err != nil {
			return err
		}
	}
	t.prevSnap = prev
	results, err := r.wr.changelog(ctx, recs, false)
	if err != nil {
		return fmt.Errorf("changelog fence: %w", err)
	}
	for _, res := range results {
		if res.Err != nil {
			return fmt.Errorf("changelog fence: %w", res.Err)
		}
		t.clEnd = max(t.clEnd, res.Record.Offset+1)
	}
	return nil
}

// clEntry is one changelog record kept for a restore.
type clEntry struct {
	off      int64
	key, val []byte
}

// restoreFromChangelog rebuilds t's state from its changelog partition: the
// valid history below bound (see the top of this file).
func (r *route) restoreFromChangelog(ctx context.Context, t *task, bound int64) error {
	start := time.Now()
	r.grp.mu.Lock()
	r.grp.mu.restoring++
	r.grp.mu.Unlock()
	defer func() {
		r.grp.mu.Lock()
		r.grp.mu.restoring--
		r.grp.mu.restoreS += time.Since(start).Seconds()
		r.grp.mu.Unlock()
	}()
	topic := t.seg.changelog
	ends, err := r.grp.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("changelog %s: end offsets: %w", topic, err)
	}
	eo, ok := ends.Lookup(topic, t.part)
	if !ok {
		return fmt.Errorf("changelog %s[%d]: no end offset", topic, t.part)
	}
	end := eo.Offset
	var entries []clEntry
	var journal []byte
	type fence struct{ from, to int64 }
	var fences []fence
	if end > 0 {
		base := append([]kgo.Opt{kgo.SeedBrokers(r.m.cfg.Seeds...)}, r.m.cfg.ClientOpts...)
		cl, err := kgo.NewClient(append(base,
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {t.part: kgo.NewOffset().AtStart()}}),
			kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(64<<20),
			// What an aborted transaction wrote is not state; commit and
			// abort markers come back so the read reaches the end.
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())...)
		if err != nil {
			return err
		}
		defer cl.Close()
		next := int64(0)
		for next < end {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ferr error
			fs.EachError(func(_ string, _ int32, err error) { ferr = err })
			if ferr != nil {
				return fmt.Errorf("changelog %s[%d]: %w", topic, t.part, ferr)
			}
			fs.EachRecord(func(rec *kgo.Record) {
				next = max(next, rec.Offset+1)
				if rec.Offset >= end || len(rec.Key) == 0 || rec.Attrs.IsControl() {
					return
				}
				val, live := clValue(rec)
				if rec.Key[0] == clFence {
					if live && len(val) == 8 {
						fences = append(fences, fence{int64(binary.BigEndian.Uint64(val)), rec.Offset})
					}
					return
				}
				if !stepHeaderIs(rec, t.stepName) {
					return
				}
				if rec.Key[0] == clJournal {
					if live {
						journal = val
					}
					return
				}
				if rec.Offset < bound {
					if !live {
						val = nil
					}
					entries = append(entries, clEntry{off: rec.Offset, key: rec.Key, val: val})
				}
			})
			r.m.met.restoreRecords.WithLabelValues(r.name).Add(float64(fs.NumRecords()))
			r.grp.mu.Lock()
			r.grp.mu.restored += int64(fs.NumRecords())
			r.grp.mu.Unlock()
		}
	}
	fenced := func(off int64) bool {
		for _, f := range fences {
			if off >= f.from && off < f.to {
				return true
			}
		}
		return false
	}
	kv, snap, inbox := map[string][]byte{}, map[string][]byte{}, map[string][]byte{}
	for _, e := range entries {
		if fenced(e.off) {
			continue
		}
		var m map[string][]byte
		switch e.key[0] {
		case clKV:
			m = kv
		case clSnap:
			m = snap
		case clInbox:
			m = inbox
		default:
			continue
		}
		if e.val == nil { // a tombstone (live values are never nil)
			delete(m, string(e.key[1:]))
		} else {
			m[string(e.key[1:])] = e.val
		}
	}
	if err := r.m.store().ReplaceStep(r.name, t.stepName, kv, snap); err != nil {
		return err
	}
	if err := r.m.store().ReplaceStep(r.name, t.inboxName, nil, inbox); err != nil {
		return err
	}
	if journal != nil {
		if err := r.m.store().PutDurable(r.name, t.stepName, journal); err != nil {
			return err
		}
	}
	d := time.Since(start)
	r.m.met.restoreSeconds.WithLabelValues(r.name).Observe(d.Seconds())
	r.log.Info("state restored from changelog", "task", t.label, "changelog", topic, "bound", bound,
		"records", len(entries), "keys", len(kv)+len(snap), "fences", len(fences), "duration", d)
	return nil
}

func stepHeaderIs(rec *kgo.Record, name string) bool {
	for _, h := range rec.Headers {
		if h.Key == headerStepName {
			return string(h.Value) == name
		}
	}
	return false
}
