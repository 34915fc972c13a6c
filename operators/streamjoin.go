package operators

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// The stream form of `join:` (an interval join): the route's records (the
// left side) meet the records of a second topic (the right side, `stream:`)
// with the same key whose event times are close enough:
//
//	tL - before <= tR <= tL + after
//
// Both sides are keyed by the pipeline through the step's repartition
// topic (left by `on`, right by `other`), so one task holds both sides of
// a key. Each side waits in the step's KV for its partners; the watermark
// bounds how long:
//
//   - a record whose event time is more than `grace` behind the watermark
//     is a dead letter with reason `late`;
//   - a left record is forgotten once wm > tL + after + grace, a right one
//     once wm > tR + before + grace: no record accepted after that can
//     match it (an accepted right record has tR >= wm - grace > tL + after).
//
// So every pair of accepted records that matches is emitted exactly once,
// whatever order they arrive in, and `left` / `outer` emit a record that
// never matched with the other side nil when it is forgotten.
//
// The KV layout (byte by byte):
//
//	'L'|'R' uvarint(len key) key time(8) seq(8) -> flags(1) record
//	'x' 'L'|'R' time(8) seq(8) key              -> empty: expiry index
//	'w'                                         -> watermark(8)
//	'n'                                         -> end of the seq block(8)
//
// time is putTime (sorts like signed millis); seq numbers the records the
// step buffered, so two records with equal key and time are both kept.
// Seqs are taken in blocks of seqBlock: 'n' is written once per block, and
// a step built again (a restore) starts a new block after it, so no seq is
// used twice whatever was written after the last checkpoint.
// flags bit 1: the record matched. The record is encoded by encodeSide.
// Invariants:
//
//  1. 'L'/'R' k t s exists iff 'x' side t s k exists.
//  2. After Advance(wm), no left record with t + after + grace < wm and no
//     right record with t + before + grace < wm remains.
//  3. 'w' is the highest watermark Advance was given.

// JoinKind is what a stream join emits besides the matched pairs.
type JoinKind int

const (
	JoinInner JoinKind = iota // matched pairs only
	JoinLeft                  // and the left records that never matched
	JoinOuter                 // and the records of either side that never matched
)

// StreamInput is the second input of a stream join: the topic, how its
// records' event time is read (nil: the record timestamp) and their
// format ("json" or "raw").
type StreamInput struct {
	Topic     string
	EventTime *Expr
	Format    string
}

// Interval is a stream join's `within`: a right record matches a left one
// from Before before it to After after it.
type Interval struct {
	Before, After time.Duration
}

// TwoInputs is a Keyed step with a second input (a stream join): the
// pipeline reads Input's topic as well, keys its records by OtherKey into
// the step's repartition topic, and hands them to ProcessOther.
type TwoInputs interface {
	Keyed
	Input() StreamInput
	OtherKey(r *Record) (string, error)
	ProcessOther(r *Record, out Emitter)
}

func init() {
	register(&Spec{
		Kind:    "join",
		Form:    "stream",
		Order:   31,
		Summary: "Joins the route's records with the records of a second topic whose key is equal and whose event time is within an interval of theirs (a stream-stream interval join); both sides wait in the step's state for `within` + `grace`.",
		Keys: []Key{
			{Name: "stream", Type: TypeStream, Required: true,
				Doc:   "The second input: `{ topic: T, event_time: EXPR, format: json }` (`event_time` reads the stream's records; without it, their timestamp).",
				Needs: "the second topic, e.g. `stream: { topic: authorizations, event_time: value.ts }`"},
			{Name: "on", Type: TypeExpr, Required: true,
				Doc:   "The key of the route's records (the left side): strings as they are, numbers without a trailing `.0`; null matches nothing.",
				Needs: "the expression that keys the route's records, e.g. `on: value.auth_id`"},
			{Name: "other", Type: TypeExpr, Required: true, OtherSide: true,
				Doc:   "The key of the stream's records (the right side), read on their value; null matches nothing.",
				Needs: "the expression that keys the stream's records, e.g. `other: value.id`"},
			{Name: "within", Type: TypeInterval, Required: true,
				Doc:   "How far a right record's event time may be from the left one's: `{ before: 5m, after: 1m }` matches tL − before ≤ tR ≤ tL + after.",
				Needs: "the interval, e.g. `within: { before: 5m, after: 1m }`"},
			{Name: "grace", Type: TypeDuration, Required: true, ZeroOK: true,
				Doc:   "How far behind the watermark a record may still come; later ones are dead letters with reason `late`. Each side is kept for `within` + `grace` and no longer.",
				Needs: "how long records may come late, e.g. `grace: 30s`: it bounds the state (each side is kept for `within` + `grace`), so it must be written"},
			{Name: "kind", Type: TypeEnum, Default: "inner", Choices: []string{"inner", "left", "outer"},
				Doc: "`inner`: matched pairs only; `left`: also each route record that matched nothing, with `as` nil, once the watermark passes its window; `outer`: also each stream record that matched nothing, with `value` nil and the record under `as`."},
			{Name: "as", Type: TypeName, Required: true,
				Doc:   "The name the stream record's value is bound under for the steps after it, as a table join binds its row.",
				Needs: "the name the stream record is bound under, e.g. `as: auth`"},
		},
		KeyedBy: "on",
		Usage:   "`join: { stream: { topic: authorizations, event_time: value.ts }, on: value.auth_id, other: value.id, within: { before: 5m, after: 1m }, grace: 30s, as: auth }`",
		Example: `route: payments-authorized
source: { topic: payments, event_time: value.ts }
sink: { topic: payments.authorized }
steps:
  - join:
      stream: { topic: authorizations, event_time: value.ts, format: json }
      on: value.auth_id
      other: value.id
      within: { before: 5m, after: 1m }
      grace: 30s
      kind: left
      as: auth
  - map:
      payment: value.id
      amount: value.amount
      auth: auth?.id
      approved: auth?.approved
`,
		Compile: func(a *Args) (*Plan, error) {
			in, within := a.Stream("stream"), a.Interval("within")
			on, other, as := a.Expr("on"), a.Expr("other"), a.String("as")
			kind := map[string]JoinKind{"inner": JoinInner, "left": JoinLeft, "outer": JoinOuter}[a.String("kind")]
			grace := a.Duration("grace")
			var errs KeyErrors
			if within.Before < 0 || within.After < 0 {
				errs = append(errs, &KeyError{Key: "within", Msg: "`within.before` and `within.after` must not be negative"})
			}
			if in.Format != "" && in.Format != "json" && in.Format != "raw" {
				errs = append(errs, &KeyError{Key: "stream", Msg: fmt.Sprintf("`stream.format` must be json or raw, not %s", in.Format)})
			}
			if len(errs) > 0 {
				return nil, errs
			}
			return &Plan{
				New: func(env BuildEnv) (Step, error) {
					return NewStreamJoin(in, on, other, within, grace, kind, as, env.KV), nil
				},
				Traits: Traits{Keyed: true, Timed: true, Absorbing: true, TwoInputs: true,
					HoldsWatermark: joinHold(within, grace, kind)},
				Binds: as,
				Input: &in,
			}, nil
		},
	})
}

// joinHold is how far behind the watermark a stream join emits: a pair
// once its later record comes, up to grace behind; with left, a route
// record that matched nothing once the watermark passes tL + after +
// grace; with outer, a stream record too, at tR + before + grace.
func joinHold(within Interval, grace time.Duration, kind JoinKind) int64 {
	h := grace.Milliseconds()
	switch kind {
	case JoinLeft:
		h += within.After.Milliseconds()
	case JoinOuter:
		h += max(within.After, within.Before).Milliseconds()
	}
	return h
}

// streamJoin is the step; one instance per owned partition of its
// repartition topic, driven by one task.
type streamJoin struct {
	in            StreamInput
	on, other     *Expr
	before, after int64 // millis
	grace         int64
	kind          JoinKind
	as            string
	kv            KV

	// oldest is the time of the oldest record buffered on each side
	// (left, right) when oldKnown: Advance skips a side with nothing to
	// forget without reading the KV.
	oldest   [2]int64
	oldKnown [2]bool
	// gone is, when goneKnown, a time at or before which every record of
	// the side has been forgotten: the next expiry scan starts after it
	// instead of walking the store's tombstones of what it deleted.
	gone      [2]int64
	goneKnown [2]bool

	loaded      bool // wm and seq were read from the KV
	wm          int64
	hasWM       bool
	seq, seqEnd uint64

	kbuf, ibuf, vbuf []byte
	found            []joinHit
	expired          [][]byte
}

// joinHit is a buffered record a Process matched, copied out of the KV.
type joinHit struct {
	key []byte // its KV key
	val []byte // flags + record
}

// NewStreamJoin returns the stream form of `join:`. kv holds its state;
// nil gives it a private MemKV (tests).
func NewStreamJoin(in StreamInput, on, other *Expr, within Interval, grace time.Duration, kind JoinKind, as string, kv KV) TwoInputs {
	if kv == nil {
		kv = NewMemKV()
	}
	return &streamJoin{in: in, on: on, other: other, before: within.Before.Milliseconds(), after: within.After.Milliseconds(),
		grace: grace.Milliseconds(), kind: kind, as: as, kv: kv}
}

func (j *streamJoin) Kind() string       { return "join" }
func (j *streamJoin) Absorbs()           {}
func (j *streamJoin) Input() StreamInput { return j.in }

// ShuffleKey implements Keyed: the left side's key.
func (j *streamJoin) ShuffleKey(r *Record) (string, error) { return shuffleKey(j.on, r) }

// OtherKey is the right side's key.
func (j *streamJoin) OtherKey(r *Record) (string, error) { return shuffleKey(j.other, r) }

const (
	sideLeft  = 'L'
	sideRight = 'R'

	joinMatched = 1
)

// seqBlock is how many seqs one write of 'n' reserves.
const seqBlock = 1024

var (
	keyWM  = []byte{'w'}
	keySeq = []byte{'n'}
)

// load reads the watermark and the sequence from the KV once.
func (j *streamJoin) load() error {
	if j.loaded {
		return nil
	}
	v, ok, err := j.kv.Get(keyWM)
	if err != nil {
		return err
	}
	if ok && len(v) == 8 {
		j.wm, j.hasWM = getTime(v), true
	}
	v, ok, err = j.kv.Get(keySeq)
	if err != nil {
		return err
	}
	if ok && len(v) == 8 {
		j.seq = binary.BigEndian.Uint64(v)
		j.seqEnd = j.seq
	}
	j.loaded = true
	return nil
}

// Process takes a record of the route (the left side).
func (j *streamJoin) Process(r *Record, out Emitter) {
	defer recoverTo("join", r, out)
	j.process(r, sideLeft, out)
}

// ProcessOther takes a record of the stream (the right side).
func (j *streamJoin) ProcessOther(r *Record, out Emitter) {
	defer recoverTo("join", r, out)
	j.process(r, sideRight, out)
}

func (j *streamJoin) process(r *Record, side byte, out Emitter) {
	if err := j.load(); err != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("join %s: state: %w", j.as, err))
		return
	}
	e := j.on
	if side == sideRight {
		e = j.other
	}
	v, err := e.Eval(r)
	if err != nil {
		out.DeadLetter(r, evalReason(err), fmt.Errorf("join %s: %w", j.as, err))
		return
	}
	t := r.EventTime
	if j.hasWM && t < j.wm-j.grace {
		out.DeadLetter(r, ReasonLate, fmt.Errorf("join %s: event time %s is more than grace %s behind the watermark %s",
			j.as, fmtMillis(t), time.Duration(j.grace)*time.Millisecond, fmtMillis(j.wm)))
		return
	}
	if v == nil {
		// A null key matches nothing: left and outer emit it now, as it
		// would be at its expiry.
		if j.emitsUnmatched(side) {
			j.emitUnmatched(r, side, out)
		}
		return
	}
	key, err := keyString(v)
	if err != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("join %s: %s: %w", j.as, e.Source, err))
		return
	}
	// The partners: the other side's records of this key in the interval.
	other, lo, hi := byte(sideRight), t-j.before, t+j.after
	if side == sideRight {
		other, lo, hi = sideLeft, t-j.after, t+j.before
	}
	pre := appendSideKey(j.kbuf[:0], other, key)
	start := putTime(append([]byte(nil), pre...), lo)
	end := putTime(pre, hi+1)
	j.kbuf = end
	j.found = j.found[:0]
	if err := j.kv.Scan(start, end, func(k, val []byte) bool {
		j.found = append(j.found, joinHit{key: append([]byte(nil), k...), val: append([]byte(nil), val...)})
		return true
	}); err != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("join %s: state: %w", j.as, err))
		return
	}
	// Buffer the record before emitting: a later step may change it.
	var flags byte
	if len(j.found) > 0 {
		flags = joinMatched
	}
	if err := j.insert(r, side, key, t, flags); err != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("join %s: state: %w", j.as, err))
		return
	}
	for i, h := range j.found {
		partner, err := decodeSide(h.val[1:])
		if err != nil {
			out.DeadLetter(r, ReasonError, fmt.Errorf("join %s: state: %w", j.as, err))
			continue
		}
		if h.val[0]&joinMatched == 0 && j.emitsUnmatched(other) {
			// Remember that it matched, so its expiry does not emit it.
			h.val[0] |= joinMatched
			if err := j.kv.Set(h.key, h.val); err != nil {
				out.DeadLetter(r, ReasonError, fmt.Errorf("join %s: state: %w", j.as, err))
				continue
			}
		}
		var left, right *Record
		if side == sideLeft {
			left, right = r, partner
			if i < len(j.found)-1 {
				// Every output but the last gets a copy of r's value.
				if left, err = j.copyOf(r); err != nil {
					out.DeadLetter(r, ReasonError, fmt.Errorf("join %s: %w", j.as, err))
					continue
				}
			}
		} else {
			left, right = partner, r
		}
		j.emitPair(left, right, out)
	}
}

func (j *streamJoin) emitsUnmatched(side byte) bool {
	return j.kind == JoinOuter || (j.kind == JoinLeft && side == sideLeft)
}

// emitPair emits left with right's value bound under `as`.
func (j *streamJoin) emitPair(left, right *Record, out Emitter) {
	if left.Bound == nil {
		left.Bound = make(map[string]any, 1)
	}
	left.shuffleKeyFor = nil // a later key may read the bound name
	left.Bound[j.as] = right.Value
	left.EventTime = max(left.EventTime, right.EventTime)
	left.Timestamp = max(left.Timestamp, right.Timestamp)
	out.Emit(left)
}

// emitUnmatched emits a record that never matched: a left one with `as`
// nil, a right one with a nil value and its own under `as`.
func (j *streamJoin) emitUnmatched(r *Record, side byte, out Emitter) {
	if side == sideLeft {
		if r.Bound == nil {
			r.Bound = make(map[string]any, 1)
		}
		r.shuffleKeyFor = nil
		r.Bound[j.as] = nil
		out.Emit(r)
		return
	}
	row := &Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Headers: r.Headers,
		Timestamp: r.Timestamp, EventTime: r.EventTime, Bound: map[string]any{j.as: r.Value}}
	out.Emit(row)
}

// copyOf is a copy of r whose value is decoded anew.
func (j *streamJoin) copyOf(r *Record) (*Record, error) {
	b, err := encodeSide(nil, r)
	if err != nil {
		return nil, err
	}
	return decodeSide(b)
}

func appendSideKey(b []byte, side byte, key string) []byte {
	b = append(b, side)
	b = binary.AppendUvarint(b, uint64(len(key)))
	return append(b, key...)
}

// insert buffers r on its side, with its expiry index entry.
func (j *streamJoin) insert(r *Record, side byte, key string, t int64, flags byte) error {
	j.seq++
	var sb [8]byte
	if j.seq > j.seqEnd {
		binary.BigEndian.PutUint64(sb[:], j.seq-1+seqBlock)
		if err := j.kv.Set(keySeq, sb[:]); err != nil {
			return err
		}
		j.seqEnd = j.seq - 1 + seqBlock
	}
	binary.BigEndian.PutUint64(sb[:], j.seq)
	j.kbuf = append(putTime(appendSideKey(j.kbuf[:0], side, key), t), sb[:]...)
	j.ibuf = append(append(putTime(append(j.ibuf[:0], 'x', side), t), sb[:]...), key...)
	var err error
	j.vbuf, err = encodeSide(append(j.vbuf[:0], flags), r)
	if err != nil {
		return err
	}
	if si := sideIndex(side); j.oldKnown[si] && t < j.oldest[si] {
		j.oldest[si] = t
	}
	if err := j.kv.Set(j.ibuf, nil); err != nil {
		j.oldKnown[sideIndex(side)] = false
		return err
	}
	return j.kv.Set(j.kbuf, j.vbuf)
}

// Advance forgets what no record still accepted can match (invariant 2),
// emitting the unmatched records of a left or outer join.
func (j *streamJoin) Advance(wm int64, out Emitter) {
	if err := j.load(); err != nil {
		return // kept for the next Advance: holding longer is safe
	}
	if j.hasWM && wm <= j.wm {
		return
	}
	j.wm, j.hasWM = wm, true
	var wb [8]byte
	if j.kv.Set(keyWM, putTime(wb[:0], wm)) != nil {
		return
	}
	j.expire(sideLeft, wm, j.after, out)
	j.expire(sideRight, wm, j.before, out)
}

// expire forgets side's records with t + span + grace < wm.
func (j *streamJoin) expire(side byte, wm, span int64, out Emitter) {
	keep := span + j.grace
	if wm < math.MinInt64+keep+1 {
		return
	}
	cut := wm - keep - 1 // forget times <= cut
	si := sideIndex(side)
	if j.oldKnown[si] && j.oldest[si] > cut {
		return // nothing buffered on this side is that old
	}
	// One scan: the entries to forget, then the first one kept, whose
	// time tells the next Advance whether it has anything to do.
	j.expired = j.expired[:0]
	j.oldKnown[si], j.oldest[si] = true, math.MaxInt64
	from := []byte{'x', side}
	if j.goneKnown[si] && j.gone[si] < math.MaxInt64 {
		from = putTime(from, j.gone[si]+1)
	}
	err := j.kv.Scan(from, []byte{'x', side + 1}, func(k, _ []byte) bool {
		if len(k) < 18 {
			return true // not an index entry: left alone
		}
		if t := getTime(k[2:10]); t > cut {
			j.oldest[si] = t
			return false
		}
		j.expired = append(j.expired, append([]byte(nil), k...))
		return true
	})
	if err != nil {
		j.oldKnown[si] = false
		return
	}
	emit := j.emitsUnmatched(side)
	for _, ik := range j.expired {
		// 'x' side time(8) seq(8) key
		t, seq, key := ik[2:10], ik[10:18], ik[18:]
		j.kbuf = append(append(appendSideKey(j.kbuf[:0], side, string(key)), t...), seq...)
		if emit {
			v, ok, err := j.kv.Get(j.kbuf)
			if err != nil {
				return
			}
			if ok && len(v) > 0 && v[0]&joinMatched == 0 {
				if r, err := decodeSide(v[1:]); err == nil {
					j.emitUnmatched(r, side, out)
				}
			}
		}
		if j.kv.Delete(j.kbuf) != nil || j.kv.Delete(ik) != nil {
			j.oldKnown[si] = false
			return
		}
	}
	j.gone[si], j.goneKnown[si] = cut, true
}

func sideIndex(side byte) int {
	if side == sideRight {
		return 1
	}
	return 0
}

// encodeSide appends r as the join keeps it:
//
//	flags(1): 1 key nil, 2 value nil, 4 value raw string, 8 bound present
//	varint partition, offset, timestamp, event time
//	uvarint-prefixed topic, key (unless nil), value (unless nil), bound JSON (when present)
//	uvarint headers, each uvarint-prefixed key and value
func encodeSide(b []byte, r *Record) ([]byte, error) {
	var flags byte
	if r.Key == nil {
		flags |= 1
	}
	var val []byte
	if s, isStr := r.Value.(string); isStr && !r.rawSet && r.Raw != nil && string(r.Raw) == s {
		flags |= 4 // format raw: the bytes as they came
		val = r.Raw
	} else if r.Value == nil {
		flags |= 2
	} else if raw, ok := r.ValueBytes(); ok {
		val = raw // the bytes it was decoded from, copied below
	} else {
		var err error
		if val, err = r.EncodeValue(nil); err != nil {
			return nil, fmt.Errorf("encode value: %w", err)
		}
	}
	var bound []byte
	if len(r.Bound) > 0 {
		var err error
		if bound, err = jsoncodec.Append(nil, r.Bound); err != nil {
			return nil, fmt.Errorf("encode bindings: %w", err)
		}
		flags |= 8
	}
	b = append(b, flags)
	b = binary.AppendVarint(b, int64(r.Partition))
	b = binary.AppendVarint(b, r.Offset)
	b = binary.AppendVarint(b, r.Timestamp)
	b = binary.AppendVarint(b, r.EventTime)
	b = appendBytes(b, []byte(r.Topic))
	if r.Key != nil {
		b = appendBytes(b, r.Key)
	}
	if flags&2 == 0 {
		b = appendBytes(b, val)
	}
	if flags&8 != 0 {
		b = appendBytes(b, bound)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Headers)))
	for _, h := range r.Headers {
		b = appendBytes(appendBytes(b, []byte(h.Key)), h.Value)
	}
	return b, nil
}

func appendBytes(b, v []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

var errSide = errors.New("join state entry is corrupt")

type sideReader struct {
	b   []byte
	err error
}

func (d *sideReader) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errSide
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *sideReader) bytes() []byte {
	if d.err != nil {
		return nil
	}
	l, n := binary.Uvarint(d.b)
	if n <= 0 || l > uint64(len(d.b)-n) {
		d.err = errSide
		return nil
	}
	v := d.b[n : n+int(l) : n+int(l)]
	d.b = d.b[n+int(l):]
	return v
}

// decodeSide reads what encodeSide wrote into a new record (its value
// decoded whole). b must not change while the record is used.
func decodeSide(b []byte) (*Record, error) {
	if len(b) < 1 {
		return nil, errSide
	}
	flags := b[0]
	d := &sideReader{b: b[1:]}
	r := &Record{Partition: int32(d.varint()), Offset: d.varint(), Timestamp: d.varint(), EventTime: d.varint()}
	r.Topic = string(d.bytes())
	if flags&1 == 0 {
		r.Key = d.bytes()
		if r.Key == nil && d.err == nil {
			r.Key = []byte{}
		}
	}
	var val, bound []byte
	if flags&2 == 0 {
		val = d.bytes()
	}
	if flags&8 != 0 {
		bound = d.bytes()
	}
	if d.err == nil {
		l, n := binary.Uvarint(d.b)
		if n <= 0 || l > uint64(len(d.b)) {
			d.err = errSide
		} else {
			d.b = d.b[n:]
			for range l {
				k := d.bytes()
				v := d.bytes()
				if d.err != nil {
					break
				}
				r.Headers = append(r.Headers, Header{Key: string(k), Value: v})
			}
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errSide, len(d.b))
	}
	switch {
	case flags&2 != 0:
	case flags&4 != 0:
		r.Raw, r.Value = val, string(val)
	default:
		if err := r.SetJSON(val); err != nil {
			return nil, fmt.Errorf("%w: value: %v", errSide, err)
		}
	}
	if bound != nil {
		v, err := jsoncodec.Decode(bound)
		m, ok := v.(map[string]any)
		if err != nil || !ok {
			return nil, fmt.Errorf("%w: bindings", errSide)
		}
		r.Bound = m
	}
	return r, nil
}

func fmtMillis(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
