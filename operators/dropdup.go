package operators

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// drop_duplicates keeps its memory in a KV, never in a Go map, so
// that tens of millions of keys can live in pebble. The layout of the
// namespace (byte by byte):
//
//	"k" <key bytes>                  -> 8 bytes: event time of the record that
//	                                    passed, big-endian, sign bit flipped
//	                                    (empty value when there is no ttl)
//	"t" <8 bytes time as above> <key> -> empty; only with a ttl
//
// The "t" entries are an index by expiry order: flipping the sign bit
// makes big-endian bytes sort like the signed times, so Advance finds every
// expired key with one ordered scan from "t" up to the cut and deletes both
// entries. Invariants:
//
//  1. With a ttl, "k"+key exists iff "t"+time+key exists, with the same time.
//  2. A dropped duplicate writes nothing: it neither extends the ttl nor
//     moves the key in the index.
//  3. After Advance(wm), no key with time+ttl <= wm remains.
//
// Semantics: a record passes when its key is unknown, or when it is known
// but the record's event time is at or past time+ttl (the key had expired
// but Advance had not yet forgotten it); the record then becomes the one
// the key is remembered by. Otherwise it is dropped. Once the watermark
// reaches time+ttl the key is forgotten, so a later record with the same
// key passes whatever its event time.
type dropDuplicates struct {
	key *Expr
	ttl int64 // millis; 0 = forever
	kv  KV

	// Scratch buffers: a Keyed step instance is driven by one task, so they are
	// reused instead of allocating two keys per record.
	kbuf, tbuf []byte
	vbuf       [8]byte
	expired    [][]byte
}

func init() {
	register(&Spec{
		Kind:    "drop_duplicates",
		Order:   20,
		Summary: "Passes the first record for each key and drops the later ones while the key is remembered; its state moves with the key's partition.",
		Keys: []Key{
			{Name: "key", Type: TypeExpr, Required: true, Doc: "What identifies a duplicate.",
				Needs: "the expression that identifies a duplicate, e.g. `key: value.txn_id`"},
			{Name: "ttl", Type: TypeDuration, Absent: "forever",
				Doc: "How long, in event time after the record that passed, a key is remembered; dropped duplicates do not extend it."},
		},
		KeyedBy: "key",
		Usage:   "`drop_duplicates: { key: value.txn_id, ttl: 1h }`",
		Example: `route: payments-once
source: { topic: payments, event_time: value.ts }
sink: { topic: payments.unique }
steps:
  - drop_duplicates: { key: value.txn_id, ttl: 24h }
`,
		Compile: func(a *Args) (*Plan, error) {
			key, ttl := a.Expr("key"), a.Duration("ttl")
			// Its state lives in the KV, which the changelog follows: not
			// Stateful. Only a ttl makes it follow the watermark.
			plan := &Plan{
				New:    func(env BuildEnv) (Step, error) { return NewDropDuplicates(key, ttl, env.KV), nil },
				Traits: Traits{Keyed: true, Timed: ttl > 0},
			}
			if ttl == 0 {
				plan.Warnings = KeyErrors{{Msg: "drop_duplicates without `ttl` remembers every key for good: its state grows with each new key and is never trimmed; give it a `ttl` (e.g. `ttl: 24h`) unless the keys are few"}}
			}
			return plan, nil
		},
	})
}

// NewDropDuplicates returns the `drop_duplicates:` step. ttl 0 remembers
// keys forever. kv holds its state; nil gives it a private MemKV (tests).
func NewDropDuplicates(key *Expr, ttl time.Duration, kv KV) Keyed {
	if kv == nil {
		kv = NewMemKV()
	}
	d := &dropDuplicates{key: key, ttl: ttl.Milliseconds(), kv: kv}
	if d.ttl == 0 {
		// Keys kept forever: the step never reads the watermark, so it is
		// not Timed, and the pipeline sends it no watermark markers.
		return d
	}
	return dropDuplicatesTTL{d}
}

// dropDuplicatesTTL is drop_duplicates with a ttl: Timed, its keys expire
// as the watermark passes them.
type dropDuplicatesTTL struct{ *dropDuplicates }

func (d *dropDuplicates) Kind() string { return "drop_duplicates" }

// ShuffleKey implements Keyed.
func (d *dropDuplicates) ShuffleKey(r *Record) (string, error) {
	return shuffleKey(d.key, r)
}

// shuffleKey evaluates a step's key expression once per record and caches
// it on the record, so Process after ShuffleKey does not evaluate again.
func shuffleKey(e *Expr, r *Record) (string, error) {
	if e == nil {
		return "", nil
	}
	if r.shuffleKeyFor == e {
		return r.shuffleKey, nil
	}
	v, err := e.Eval(r)
	if err != nil {
		return "", err
	}
	k, err := keyString(v)
	if err != nil {
		return "", fmt.Errorf("%s: %w", e.Source, err)
	}
	r.shuffleKey, r.shuffleKeyFor = k, e
	return k, nil
}

// putTime appends t so that bytes order like signed times.
func putTime(b []byte, t int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t)^(1<<63))
}

func getTime(b []byte) int64 {
	return int64(binary.BigEndian.Uint64(b) ^ (1 << 63))
}

func (d *dropDuplicates) Process(r *Record, out Emitter) {
	defer recoverTo("drop_duplicates", r, out)
	key, err := shuffleKey(d.key, r)
	if err != nil {
		out.DeadLetter(r, evalReason(err), fmt.Errorf("drop_duplicates: %w", err))
		return
	}
	d.kbuf = append(append(d.kbuf[:0], 'k'), key...)
	old, found, err := d.kv.Get(d.kbuf)
	if err != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("drop_duplicates: state: %w", err))
		return
	}
	t := r.EventTime
	if found {
		if d.ttl == 0 || len(old) != 8 {
			return
		}
		prev := getTime(old)
		if t < prev+d.ttl {
			return
		}
		// Expired but not yet forgotten: this record passes and takes the
		// key over, so its old index entry goes (invariant 1).
		d.tbuf = append(putTime(append(d.tbuf[:0], 't'), prev), key...)
		if err := d.kv.Delete(d.tbuf); err != nil {
			out.DeadLetter(r, ReasonError, fmt.Errorf("drop_duplicates: state: %w", err))
			return
		}
	}
	if d.ttl == 0 {
		err = d.kv.Set(d.kbuf, nil)
	} else {
		d.tbuf = append(putTime(append(d.tbuf[:0], 't'), t), key...)
		if err = d.kv.Set(d.tbuf, nil); err == nil {
			err = d.kv.Set(d.kbuf, putTime(d.vbuf[:0], t))
		}
	}
	if err != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("drop_duplicates: state: %w", err))
		return
	}
	out.Emit(r)
}

// Advance forgets every key whose time+ttl is at or before the watermark.
// A state error cannot be reported per record here; it leaves the keys for
// the next Advance, which is safe: remembering longer only drops more
// duplicates of a key whose ttl has passed (they pass anyway, see Process).
func (d dropDuplicatesTTL) Advance(watermark int64, _ Emitter) {
	if watermark < math.MinInt64+d.ttl {
		return // nothing can be that old, and watermark-ttl would wrap
	}
	cut := watermark - d.ttl // expire times <= cut; cut+1 cannot wrap as ttl > 0
	end := putTime([]byte{'t'}, cut+1)
	d.expired = d.expired[:0]
	_ = d.kv.Scan([]byte{'t'}, end, func(k, _ []byte) bool {
		d.expired = append(d.expired, append([]byte(nil), k...))
		return true
	})
	for _, tk := range d.expired {
		d.kbuf = append(append(d.kbuf[:0], 'k'), tk[9:]...)
		if d.kv.Delete(d.kbuf) != nil || d.kv.Delete(tk) != nil {
			return
		}
	}
}
