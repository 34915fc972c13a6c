package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Key layout. One pebble DB holds every route. Every key but the format
// marker starts with its route's prefix, so a route is one contiguous key
// range (DropRoute is one range deletion) and routes never interleave:
//
//	format marker  0x00 'f'                                 → 0x01 (format version)
//	route prefix   'R' (0x52) | uvarint len(route) | route
//
//	checkpoint     route prefix | 'c'                       → checkpoint record
//	offsets        route prefix | 'o'                       → offsets.Encode bytes
//	step meta      route prefix | 'm' | step id             → step meta record
//	keyed state    route prefix | 'k' | step id | user key  → user value
//	snapshot       route prefix | 's' | step id | snap key  → snapshot value
//	durable        route prefix | 'j' | step id             → caller's bytes
//	table rows     route prefix | 't' | table id | row key  → row bytes (rows.go)
//
//	step id        uvarint len(step) | step
//
// Length-prefixing route and step makes each prefix prefix-free: no other
// route's (or step's) keys can start with it, so [prefix, prefixEnd(prefix))
// holds exactly one route's (or one step's) keys, whatever bytes the names
// contain. Under one prefix, user keys sort in plain byte order, which is
// the order KV.Scan promises.
//
// Checkpoint record (17 bytes):
//
//	+---------+-------------------+-----------------------------+
//	| version | seq               | time                        |
//	| 0x01    | uint64 big-endian | int64 big-endian, unix nano |
//	+---------+-------------------+-----------------------------+
//
// Step meta record, the step's live entries as of the last checkpoint (key
// and value bytes both counted in *Bytes):
//
//	+---------+----------+-----------+-----------+------------+
//	| version | kv keys  | kv bytes  | snap keys | snap bytes |
//	| 0x01    | uvarint  | uvarint   | uvarint   | uvarint    |
//	+---------+----------+-----------+-----------+------------+
//
// A checkpoint writes the checkpoint record, the offsets, the meta of every
// step it touched, every pending keyed-state write and every snapshot in
// one synced pebble batch; nothing else writes a route's keys except
// DropRoute, DropStepsExcept and PutDurable.
//
// A durable record ('j', PutDurable) is outside the checkpoint: one value
// per step, written alone in its own synced pebble write, never rolled
// back by a crash or by Discard. The pipeline keeps a window worker's
// close journal there (its layout is the pipeline's). DropRoute and
// DropStepsExcept delete it with the step's other keys.

const (
	formatVersion     = 1
	checkpointVersion = 1
	metaVersion       = 1

	tagRoute      = 'R'
	tagCheckpoint = 'c'
	tagOffsets    = 'o'
	tagMeta       = 'm'
	tagKV         = 'k'
	tagSnapshot   = 's'
	tagDurable    = 'j'
)

var formatKey = []byte{0x00, 'f'}

// ErrCorrupt is wrapped by errors about stored bytes that do not parse.
var ErrCorrupt = errors.New("state: corrupt record")

func routePrefix(route string) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen32+len(route)+1)
	b = append(b, tagRoute)
	b = binary.AppendUvarint(b, uint64(len(route)))
	return append(b, route...)
}

// routeKey is a route's fixed key with tag t ('c' or 'o').
func routeKey(route string, t byte) []byte {
	return append(routePrefix(route), t)
}

// stepPrefix is the prefix of step's keys under tag t ('m', 'k' or 's').
func stepPrefix(route string, t byte, step string) []byte {
	b := append(routePrefix(route), t)
	b = binary.AppendUvarint(b, uint64(len(step)))
	return append(b, step...)
}

// prefixEnd is the smallest key greater than every key starting with p,
// or nil when there is none (p is all 0xff).
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// parseRoutePrefix returns the route named by key's route prefix and the
// prefix length.
func parseRoutePrefix(key []byte) (route string, n int, err error) {
	if len(key) == 0 || key[0] != tagRoute {
		return "", 0, fmt.Errorf("%w: key %q is not a route key", ErrCorrupt, key)
	}
	l, k := binary.Uvarint(key[1:])
	if k <= 0 || uint64(len(key)-1-k) < l {
		return "", 0, fmt.Errorf("%w: key %q has a bad route length", ErrCorrupt, key)
	}
	n = 1 + k + int(l)
	return string(key[1+k : n]), n, nil
}

// parseStepID reads a step id at the start of b and returns the step and
// the id's length.
func parseStepID(b []byte) (step string, n int, err error) {
	l, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < l {
		return "", 0, fmt.Errorf("%w: bad step id %q", ErrCorrupt, b)
	}
	return string(b[k : k+int(l)]), k + int(l), nil
}

type checkpointRecord struct {
	seq  uint64
	time time.Time
}

func (r checkpointRecord) encode() []byte {
	b := make([]byte, 0, 17)
	b = append(b, checkpointVersion)
	b = binary.BigEndian.AppendUint64(b, r.seq)
	return binary.BigEndian.AppendUint64(b, uint64(r.time.UnixNano()))
}

func decodeCheckpointRecord(b []byte) (checkpointRecord, error) {
	if len(b) != 17 || b[0] != checkpointVersion {
		return checkpointRecord{}, fmt.Errorf("%w: checkpoint record %x", ErrCorrupt, b)
	}
	return checkpointRecord{
		seq:  binary.BigEndian.Uint64(b[1:9]),
		time: time.Unix(0, int64(binary.BigEndian.Uint64(b[9:17]))).UTC(),
	}, nil
}

// stepMeta counts a step's live entries as of the last checkpoint.
type stepMeta struct {
	kvKeys, kvBytes     int64
	snapKeys, snapBytes int64
}

func (m stepMeta) encode() []byte {
	b := make([]byte, 0, 1+4*binary.MaxVarintLen64)
	b = append(b, metaVersion)
	for _, v := range [...]int64{m.kvKeys, m.kvBytes, m.snapKeys, m.snapBytes} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	return b
}

func decodeStepMeta(b []byte) (stepMeta, error) {
	if len(b) == 0 || b[0] != metaVersion {
		return stepMeta{}, fmt.Errorf("%w: step meta %x", ErrCorrupt, b)
	}
	var v [4]int64
	pos := 1
	for i := range v {
		x, k := binary.Uvarint(b[pos:])
		if k <= 0 || x > 1<<62 {
			return stepMeta{}, fmt.Errorf("%w: step meta %x", ErrCorrupt, b)
		}
		v[i] = int64(x)
		pos += k
	}
	if pos != len(b) {
		return stepMeta{}, fmt.Errorf("%w: step meta %x has trailing bytes", ErrCorrupt, b)
	}
	return stepMeta{kvKeys: v[0], kvBytes: v[1], snapKeys: v[2], snapBytes: v[3]}, nil
}
