package operators

import (
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// joinEvent is one input of the reference test: a record of either side,
// or a watermark move.
type joinEvent struct {
	wm    bool
	right bool
	id    string
	key   string // "" : a null key
	t     int64
	at    int64 // the watermark (wm events)
}

// refIntervalJoin is the brute-force reference of the stream join,
// written from the semantics in docs/RULES.md and independent of the
// step: a record more than grace behind the watermark at its arrival is
// late; every pair of accepted records with equal non-null keys and
// tL-before <= tR <= tL+after is one output; left and outer add the
// accepted records of their unmatched sides. Outputs are "leftID|rightID"
// with "-" for the missing side; late is the ids of late records.
func refIntervalJoin(evs []joinEvent, before, after, grace int64, kind JoinKind) (out, late []string) {
	var ls, rs []joinEvent
	wm, has := int64(0), false
	for _, e := range evs {
		switch {
		case e.wm:
			if !has || e.at > wm {
				wm, has = e.at, true
			}
		case has && e.t < wm-grace:
			late = append(late, e.id)
		case e.right:
			rs = append(rs, e)
		default:
			ls = append(ls, e)
		}
	}
	matchedL, matchedR := map[string]bool{}, map[string]bool{}
	for _, l := range ls {
		for _, r := range rs {
			if l.key != "" && l.key == r.key && l.t-before <= r.t && r.t <= l.t+after {
				out = append(out, l.id+"|"+r.id)
				matchedL[l.id], matchedR[r.id] = true, true
			}
		}
	}
	if kind != JoinInner {
		for _, l := range ls {
			if !matchedL[l.id] {
				out = append(out, l.id+"|-")
			}
		}
	}
	if kind == JoinOuter {
		for _, r := range rs {
			if !matchedR[r.id] {
				out = append(out, "-|"+r.id)
			}
		}
	}
	slices.Sort(out)
	slices.Sort(late)
	return out, late
}

// joinCollect names each output by its sides' ids (value.id of the left,
// as.id of the right).
type joinCollect struct {
	t    *testing.T
	as   string
	out  []string
	late []string
	errs []string
}

func (c *joinCollect) Emit(r *Record) {
	l, rt := "-", "-"
	if m, ok := r.Value.(map[string]any); ok {
		l = fmt.Sprint(m["id"])
	}
	if m, ok := r.Bound[c.as].(map[string]any); ok {
		rt = fmt.Sprint(m["id"])
	}
	c.out = append(c.out, l+"|"+rt)
}

func (c *joinCollect) DeadLetter(r *Record, reason Reason, err error) {
	if reason != ReasonLate {
		c.errs = append(c.errs, fmt.Sprintf("%s: %v", reason, err))
		return
	}
	m, _ := r.Value.(map[string]any)
	c.late = append(c.late, fmt.Sprint(m["id"]))
}

func joinRecord(t *testing.T, e joinEvent) *Record {
	t.Helper()
	key := `"` + e.key + `"`
	if e.key == "" {
		key = "null"
	}
	r := &Record{Topic: "in", EventTime: e.t, Timestamp: e.t, Key: []byte(e.id)}
	if err := r.SetJSON(fmt.Appendf(nil, `{"id":%q,"k":%s,"t":%d}`, e.id, key, e.t)); err != nil {
		t.Fatal(err)
	}
	return r
}

func mustCompile(t testing.TB, src string) *Expr {
	t.Helper()
	e, err := CompileExpr(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// randomJoinEvents are records of both sides with keys from a small set,
// event times out of order (jitter up to 3 x maxJitter behind the
// newest), some far behind (late), and watermark moves that follow the
// newest time minus lateness.
func randomJoinEvents(rng *rand.Rand, n int) []joinEvent {
	var evs []joinEvent
	now := int64(1_000_000)
	keys := []string{"a", "b", "c", "d", "e", ""}
	for i := range n {
		now += rng.Int64N(400)
		t := now - rng.Int64N(3000)
		if rng.IntN(20) == 0 {
			t = now - 10_000 - rng.Int64N(5000) // likely late
		}
		t -= t % 100
		e := joinEvent{right: rng.IntN(2) == 0, key: keys[rng.IntN(len(keys))], t: t}
		if e.right {
			e.id = fmt.Sprintf("r%d", i)
		} else {
			e.id = fmt.Sprintf("l%d", i)
		}
		evs = append(evs, e)
		if rng.IntN(5) == 0 {
			evs = append(evs, joinEvent{wm: true, at: now - 2000 - now%100})
		}
	}
	return append(evs, joinEvent{wm: true, at: math.MaxInt64 / 2})
}

// TestStreamJoinMatchesReference: the stream join, on random out-of-order
// inputs of both sides with late records and watermark moves, emits
// exactly the pairs (and unmatched records) and dead letters the
// brute-force reference says, for each kind, and holds nothing once the
// watermark has passed everything.
func TestStreamJoinMatchesReference(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 27))
		// Multiples of 100 ms, as the times: the bounds are met exactly.
		before, after := rng.Int64N(30)*100, rng.Int64N(20)*100
		grace := rng.Int64N(15) * 100
		kind := JoinKind(rng.IntN(3))
		evs := randomJoinEvents(rng, 300)
		kv := NewMemKV()
		j := NewStreamJoin(StreamInput{Topic: "other"}, mustCompile(t, "value.k"), mustCompile(t, "value.k"),
			Interval{Before: time.Duration(before) * time.Millisecond, After: time.Duration(after) * time.Millisecond},
			time.Duration(grace)*time.Millisecond, kind, "as", kv)
		c := &joinCollect{t: t, as: "as"}
		for _, e := range evs {
			switch {
			case e.wm:
				j.(Timed).Advance(e.at, c)
			case e.right:
				j.ProcessOther(joinRecord(t, e), c)
			default:
				j.Process(joinRecord(t, e), c)
			}
		}
		wantOut, wantLate := refIntervalJoin(evs, before, after, grace, kind)
		slices.Sort(c.out)
		slices.Sort(c.late)
		if len(c.errs) > 0 {
			t.Fatalf("seed %d: dead letters: %v", seed, c.errs)
		}
		if !slices.Equal(c.out, wantOut) {
			t.Fatalf("seed %d kind %d before %d after %d grace %d:\n got %d %v\nwant %d %v", seed, kind, before, after, grace,
				len(c.out), c.out, len(wantOut), wantOut)
		}
		if !slices.Equal(c.late, wantLate) {
			t.Fatalf("seed %d: late %v, want %v", seed, c.late, wantLate)
		}
		if len(wantLate) == 0 {
			t.Errorf("seed %d: no late record: the test does not exercise lateness", seed)
		}
		// Only the watermark and the sequence are left.
		if n := kv.Len(); n != 2 {
			t.Errorf("seed %d: %d keys left after the final watermark, want 2", seed, n)
		}
	}
}

// TestStreamJoinStateBounded: with the watermark following the records,
// the step holds at most the records of the last within + grace (+ the
// watermark's lag) per side, however long the stream.
func TestStreamJoinStateBounded(t *testing.T) {
	kv := NewMemKV()
	j := NewStreamJoin(StreamInput{Topic: "other"}, mustCompile(t, "value.k"), mustCompile(t, "value.k"),
		Interval{Before: 5 * time.Second, After: time.Second}, 2*time.Second, JoinOuter, "as", kv)
	c := &joinCollect{t: t, as: "as"}
	most := 0
	for i := range 20_000 {
		ts := int64(i) * 10 // 100 records a second of event time
		e := joinEvent{right: i%2 == 1, id: fmt.Sprint(i), key: fmt.Sprint(i % 50), t: ts}
		if e.right {
			j.ProcessOther(joinRecord(t, e), c)
		} else {
			j.Process(joinRecord(t, e), c)
		}
		if i%10 == 0 {
			j.(Timed).Advance(ts-1000, c)
		}
		most = max(most, kv.Len())
	}
	// Left kept after + grace + lag = 4 s, right before + grace + lag = 8 s:
	// 200 + 400 records, two keys each, and 'w', 'n'.
	if bound := 2*(4*50+8*50+2*50) + 2; most > bound {
		t.Fatalf("the state held %d keys, more than %d: it is not trimmed by the watermark", most, bound)
	}
	if len(c.errs) > 0 {
		t.Fatal(c.errs)
	}
}

// TestStreamJoinOutputs: the joined record is the left value with the
// right value under `as` and the later event time; a right record that
// matched nothing in an outer join has a nil value and its own under
// `as`; an unmatched left record of a left join has `as` nil.
func TestStreamJoinOutputs(t *testing.T) {
	j := NewStreamJoin(StreamInput{Topic: "auth"}, mustCompile(t, "value.k"), mustCompile(t, "value.k"),
		Interval{Before: time.Minute}, 0, JoinOuter, "auth", nil)
	c := &collect{}
	j.ProcessOther(joinRecord(t, joinEvent{id: "r1", key: "a", t: 1000}), c)
	j.Process(joinRecord(t, joinEvent{id: "l1", key: "a", t: 2000}), c)
	j.Process(joinRecord(t, joinEvent{id: "l2", key: "b", t: 2000}), c)
	j.ProcessOther(joinRecord(t, joinEvent{id: "r2", key: "c", t: 2500}), c)
	j.(Timed).Advance(200_000, c)
	want := `emit key=l1 t=2000 value={"id":"l1","k":"a","t":2000} bound={"auth":{"id":"r1","k":"a","t":1000}}
emit key=l2 t=2000 value={"id":"l2","k":"b","t":2000} bound={"auth":null}
emit key=r2 t=2500 value=null bound={"auth":{"id":"r2","k":"c","t":2500}}
`
	if got := c.String(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// TestStreamJoinSurvivesRebuild: a step built again on the same KV (a
// restore, a move to another instance) knows the watermark and the
// buffered records, and numbers new records after the old ones.
func TestStreamJoinSurvivesRebuild(t *testing.T) {
	kv := NewMemKV()
	build := func() TwoInputs {
		return NewStreamJoin(StreamInput{Topic: "auth"}, mustCompile(t, "value.k"), mustCompile(t, "value.k"),
			Interval{Before: time.Minute}, 0, JoinInner, "auth", kv)
	}
	c := &joinCollect{as: "auth"}
	j := build()
	j.ProcessOther(joinRecord(t, joinEvent{id: "r1", key: "a", t: 1000}), c)
	j.(Timed).Advance(5000, c)
	j = build()
	j.ProcessOther(joinRecord(t, joinEvent{id: "r2", key: "a", t: 6000}), c)
	j.Process(joinRecord(t, joinEvent{id: "l1", key: "a", t: 7000}), c)
	j.Process(joinRecord(t, joinEvent{id: "l0", key: "a", t: 4000}), c) // late
	slices.Sort(c.out)
	if want := []string{"l1|r1", "l1|r2"}; !slices.Equal(c.out, want) {
		t.Fatalf("outputs %v, want %v", c.out, want)
	}
	if !slices.Equal(c.late, []string{"l0"}) {
		t.Fatalf("late %v, want [l0]", c.late)
	}
}

// TestStreamJoinDecodesBufferedInPart: a left record the route decoded
// in part (SetJSONMembers, the members its steps read) and that waited in
// the buffer comes out decoded the same way, not whole: the same members
// read, the rest of its bytes forwarded unchanged by EncodeValue. A whole
// decode would cost the 1 KiB decode that json-members saves
// (docs/BENCHMARKS.md); a left record decoded whole stays whole.
func TestStreamJoinDecodesBufferedInPart(t *testing.T) {
	want := jsoncodec.Fields{"k": {}, "id": {}}
	for _, tc := range []struct {
		name     string
		partial  bool
		raw      string
		setAfter bool // a step before the join changed a member in place
	}{
		{name: "in part", partial: true, raw: `{"id":"l1","k":"a","big":{"x":[1,2,3]},"s":"\u00e9"}`},
		{name: "in part, changed in place", partial: true, raw: `{"id":"l1","k":"a","big":{"x":[1,2,3]}}`, setAfter: true},
		{name: "whole", raw: `{"id":"l1","k":"a","big":{"x":[1,2,3]}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := NewStreamJoin(StreamInput{Topic: "auth"}, mustCompile(t, "value.k"), mustCompile(t, "value.k"),
				Interval{Before: time.Minute, After: time.Minute}, 0, JoinInner, "auth", nil)
			l := &Record{Topic: "in", EventTime: 1000, Timestamp: 1000, Key: []byte("l1")}
			var err error
			if tc.partial {
				err = l.SetJSONMembers([]byte(tc.raw), want)
			} else {
				err = l.SetJSON([]byte(tc.raw))
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.setAfter {
				l.Value.(map[string]any)["id"] = "L1"
				l.ValueChanged()
			}
			wantBytes, err := l.EncodeValue(nil)
			if err != nil {
				t.Fatal(err)
			}
			wantValue, _ := jsoncodec.Append(nil, l.Value)
			c := &collect{}
			j.Process(l, c)
			j.ProcessOther(joinRecord(t, joinEvent{id: "r1", key: "a", t: 1500}), c)
			if len(c.out) != 1 {
				t.Fatalf("outputs: %s", c)
			}
			got := c.out[0]
			if got.Partial() != tc.partial {
				t.Fatalf("emitted record decoded in part: %v, want %v", got.Partial(), tc.partial)
			}
			if v, _ := jsoncodec.Append(nil, got.Value); string(v) != string(wantValue) {
				t.Fatalf("value %s, want %s", v, wantValue)
			}
			b, err := got.EncodeValue(nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != string(wantBytes) {
				t.Fatalf("encoded %s, want %s", b, wantBytes)
			}
		})
	}
}

// TestStreamJoinBufferedMembersFollowTheRoute: a left record buffered
// decoded in part keeps the members it decoded, and comes out of the
// buffer with them without scanning its bytes again, while the route asks
// for the same members; a step built again for a route that reads more
// members (its rules changed) decodes the bytes anew with those.
func TestStreamJoinBufferedMembersFollowTheRoute(t *testing.T) {
	kv := NewMemKV()
	build := func() TwoInputs {
		return NewStreamJoin(StreamInput{Topic: "auth"}, mustCompile(t, "value.k"), mustCompile(t, "value.k"),
			Interval{Before: time.Minute, After: time.Minute}, 0, JoinInner, "auth", kv)
	}
	left := func(id, key string, want jsoncodec.Fields) *Record {
		r := &Record{Topic: "in", EventTime: 1000, Timestamp: 1000, Key: []byte(id)}
		if err := r.SetJSONMembers(fmt.Appendf(nil, `{"id":%q,"k":%q,"amount":12.5,"pad":[1,2,3]}`, id, key), want); err != nil {
			t.Fatal(err)
		}
		return r
	}
	w1 := jsoncodec.Fields{"k": {}, "id": {}}
	w2 := jsoncodec.Fields{"k": {}, "id": {}, "amount": {}}
	j := build()
	c := &collect{}
	j.Process(left("l1", "a", w1), c)
	j = build() // the route now reads value.amount too
	j.Process(left("l2", "other", w2), c)
	j.ProcessOther(joinRecord(t, joinEvent{id: "r1", key: "a", t: 1500}), c)
	if len(c.out) != 1 {
		t.Fatalf("outputs: %s", c)
	}
	got := c.out[0]
	if v, _ := jsoncodec.Append(nil, got.Value); string(v) != `{"amount":12.5,"id":"l1","k":"a"}` || !got.Partial() {
		t.Fatalf("value %s (in part %v), want the members the route reads now", v, got.Partial())
	}

	// The members kept are what is read: the bytes are not scanned again
	// (here they are not JSON, which a scan would refuse).
	r := left("l3", "b", w1)
	r.Raw = []byte(`{"id":"l3","k":"b","broken":`)
	r.rawFrom = r.Raw
	b, err := encodeSide(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeSide(b, jsoncodec.Fields{"id": {}, "k": {}})
	if err != nil {
		t.Fatalf("decoded with the members kept: %v", err)
	}
	if v, _ := jsoncodec.Append(nil, back.Value); string(v) != `{"id":"l3","k":"b"}` || !back.Partial() {
		t.Fatalf("value %s (in part %v)", v, back.Partial())
	}
	if _, err := decodeSide(b, w2); err == nil {
		t.Fatal("decoded with other members: the bytes were not scanned")
	}
}

// TestStreamJoinRebuildFindsPartners: the step skips the partner scan for
// a key with nothing buffered on the other side (its per-side key
// counts); a step built again on the same KV counts what the KV holds, so
// a record buffered before the rebuild is still found, of either side,
// and a key whose records expired is not counted any more.
func TestStreamJoinRebuildFindsPartners(t *testing.T) {
	kv := NewMemKV()
	build := func() TwoInputs {
		return NewStreamJoin(StreamInput{Topic: "auth"}, mustCompile(t, "value.k"), mustCompile(t, "value.k"),
			Interval{Before: time.Minute, After: time.Minute}, 0, JoinInner, "auth", kv)
	}
	c := &joinCollect{as: "auth"}
	j := build()
	j.ProcessOther(joinRecord(t, joinEvent{id: "r1", key: "a", t: 1000}), c)
	j.Process(joinRecord(t, joinEvent{id: "l1", key: "b", t: 1000}), c)
	j.Process(joinRecord(t, joinEvent{id: "l0", key: "c", t: 1000}), c)
	j = build()
	j.Process(joinRecord(t, joinEvent{id: "l2", key: "a", t: 2000}), c)
	j.ProcessOther(joinRecord(t, joinEvent{id: "r2", key: "b", t: 2000}), c)
	j.(Timed).Advance(200_000, c) // everything expires
	j = build()
	j.ProcessOther(joinRecord(t, joinEvent{id: "r3", key: "c", t: 200_000}), c)
	slices.Sort(c.out)
	if want := []string{"l1|r2", "l2|r1"}; !slices.Equal(c.out, want) {
		t.Fatalf("outputs %v, want %v", c.out, want)
	}
	sj := j.(*streamJoin)
	if n := len(sj.keys[0]) + len(sj.keys[1]); n != 1 || sj.keys[1][maphash.String(sj.seed, "c")] != 1 {
		t.Fatalf("key counts after the expiry: %v", sj.keys)
	}
	if len(c.errs) > 0 {
		t.Fatal(c.errs)
	}
}

// FuzzDecodeSide: the decoder of buffered records refuses what it cannot
// read without panicking, and reads back what encodeSide wrote, whether
// it decodes the value whole or in part.
func FuzzDecodeSide(f *testing.F) {
	r := &Record{Topic: "t", Partition: 3, Offset: 9, Key: []byte("k"), Timestamp: 5, EventTime: 6,
		Headers: []Header{{Key: "h", Value: []byte("v")}}, Bound: map[string]any{"x": 1.0}}
	_ = r.SetJSON([]byte(`{"a":1}`))
	b, err := encodeSide(nil, r)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b, false)
	want := jsoncodec.Fields{"a": {}}
	_ = r.SetJSONMembers([]byte(`{"a":1,"b":[2,{"c":"d"}]}`), want)
	if b, err = encodeSide(nil, r); err != nil {
		f.Fatal(err)
	}
	f.Add(b, true)
	f.Add([]byte{}, false)
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0}, false)
	f.Add([]byte{16, 0, 0, 0, 0, 0, 3, '[', '1', ']', 0}, true)
	f.Fuzz(func(t *testing.T, b []byte, inPart bool) {
		w := jsoncodec.Fields(nil)
		if inPart {
			w = want
		}
		r, err := decodeSide(b, w)
		if err != nil {
			return
		}
		again, err := encodeSide(nil, r)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		r2, err := decodeSide(again, w)
		if err != nil {
			t.Fatalf("decode of a re-encoding: %v", err)
		}
		if r2.Topic != r.Topic || r2.Offset != r.Offset || r2.EventTime != r.EventTime || string(r2.Key) != string(r.Key) {
			t.Fatalf("round trip changed the record: %+v vs %+v", r, r2)
		}
		v1, err1 := r.EncodeValue(nil)
		v2, err2 := r2.EncodeValue(nil)
		if (err1 == nil) != (err2 == nil) || string(v1) != string(v2) || r.Partial() != r2.Partial() {
			t.Fatalf("round trip changed the value: %s (%v, in part %v) vs %s (%v, in part %v)",
				v1, err1, r.Partial(), v2, err2, r2.Partial())
		}
	})
}
