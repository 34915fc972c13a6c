package operators

// Property tests: the operators against brute-force references on random
// out-of-order streams (seeded, so a failure names its seed and repeats).

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// event is one step of a random stream: a record, or a watermark advance.
type event struct {
	advance bool
	wm      int64
	key     string
	t       int64
	v       float64
	s       string
}

// randomStream makes n records whose event times wander forward with
// out-of-order jitter up to maxJitter, and advances the watermark now and
// then to max-seen minus a lateness that is sometimes smaller than the
// jitter, so some records arrive late.
func randomStream(rng *rand.Rand, n int, keys int, maxJitter int64) []event {
	var evs []event
	var maxT int64 = int64(rng.Intn(5000)) - 2500 // negative times too
	for range n {
		maxT += int64(rng.Intn(200))
		t := maxT - rng.Int63n(maxJitter+1)
		evs = append(evs, event{
			key: "k" + strconv.Itoa(rng.Intn(keys)),
			t:   t,
			v:   float64(rng.Intn(41) - 20),
			s:   string(rune('a' + rng.Intn(6))),
		})
		if rng.Intn(8) == 0 {
			evs = append(evs, event{advance: true, wm: maxT - rng.Int63n(maxJitter+1)})
		}
	}
	return evs
}

func (e event) record(i int) *Record {
	return &Record{
		Key:       []byte(e.key),
		EventTime: e.t,
		Timestamp: e.t,
		Offset:    int64(i),
		Value:     map[string]any{"user": e.key, "v": e.v, "s": e.s},
	}
}

var allAggregates = []struct {
	name, fn, arg string
}{
	{"n", "count", ""},
	{"total", "sum", "value.v"},
	{"lo", "min", "value.v"},
	{"hi", "max", "value.v"},
	{"mean", "avg", "value.v"},
	{"first_s", "first", "value.s"},
	{"last_s", "last", "value.s"},
	{"distinct_s", "count_distinct", "value.s"},
}

func windowSpec(t testing.TB, kind string, size, slide int64, onUpdate bool) WindowSpec {
	t.Helper()
	key, err := CompileExpr("value.user", nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := WindowSpec{Kind: kind, Size: time.Duration(size) * time.Millisecond, Slide: time.Duration(slide) * time.Millisecond, Key: key, EmitOnUpdate: onUpdate}
	for _, a := range allAggregates {
		agg := Aggregate{Name: a.name, Func: AggFunc(a.fn)}
		if a.arg != "" {
			if agg.Arg, err = CompileExpr(a.arg, nil); err != nil {
				t.Fatal(err)
			}
		}
		spec.Aggregates = append(spec.Aggregates, agg)
	}
	return spec
}

// refWindow is the brute-force model: it remembers which records went into
// which window and recomputes every aggregate from the list.
type refWindow struct {
	start, end int64
	key        string
	members    []event // in processing order
}

func (w *refWindow) row() map[string]any {
	row := map[string]any{"key": w.key, "window_start": w.start, "window_end": w.end}
	row["n"] = int64(len(w.members))
	sum, lo, hi := 0.0, math.Inf(1), math.Inf(-1)
	distinct := map[string]bool{}
	first, last := w.members[0], w.members[0]
	for _, m := range w.members {
		sum += m.v
		lo, hi = min(lo, m.v), max(hi, m.v)
		distinct[m.s] = true
		if m.t < first.t {
			first = m
		}
		if m.t >= last.t {
			last = m
		}
	}
	row["total"], row["lo"], row["hi"] = sum, lo, hi
	row["mean"] = sum / float64(len(w.members))
	row["first_s"], row["last_s"] = first.s, last.s
	row["distinct_s"] = int64(len(distinct))
	return row
}

// refWindows runs the model over evs and returns the rows in emission
// order (on_close) and the indexes of late records.
func refWindows(evs []event, size, slide int64) (rows []string, late []int) {
	open := map[[2]string]*refWindow{}
	var wm int64
	hasWM := false
	closeUpTo := func(to int64) {
		var closing []*refWindow
		for id, w := range open {
			if w.end <= to {
				closing = append(closing, w)
				delete(open, id)
			}
		}
		slices.SortFunc(closing, func(a, b *refWindow) int {
			if a.end != b.end {
				return int(a.end - b.end)
			}
			if a.key < b.key {
				return -1
			}
			return 1
		})
		for _, w := range closing {
			b, _ := jsoncodec.Append(nil, w.row())
			rows = append(rows, string(b))
		}
	}
	for i, e := range evs {
		if e.advance {
			if !hasWM || e.wm > wm {
				wm, hasWM = e.wm, true
				closeUpTo(wm)
			}
			continue
		}
		inAny := false
		// Every window start that is a multiple of slide with start <= t < start+size.
		for s := (e.t - size) / slide * slide; s <= e.t+slide; s += slide {
			if s > e.t || s+size <= e.t || floorDiv(s, slide)*slide != s {
				continue
			}
			if hasWM && s+size <= wm {
				continue
			}
			inAny = true
			id := [2]string{strconv.FormatInt(s, 10), e.key}
			w := open[id]
			if w == nil {
				w = &refWindow{start: s, end: s + size, key: e.key}
				open[id] = w
			}
			w.members = append(w.members, e)
		}
		if !inAny {
			late = append(late, i)
		}
	}
	closeUpTo(math.MaxInt64)
	return rows, late
}

// lateCollect remembers dead letters by offset.
type lateCollect struct {
	rows    []string
	late    []int
	other   []string
	lastRow map[string]string // on_update: last row per window
	after   int               // rows emitted by Advance (must be 0 for on_update)
}

func (c *lateCollect) Emit(r *Record) {
	b, _ := jsoncodec.Append(nil, r.Value)
	c.rows = append(c.rows, string(b))
	if c.lastRow != nil {
		c.lastRow[fmt.Sprintf("%d/%s", r.Window.End, r.Key)] = string(b)
	}
}

func (c *lateCollect) DeadLetter(r *Record, reason Reason, err error) {
	if reason == ReasonLate {
		c.late = append(c.late, int(r.Offset))
		return
	}
	c.other = append(c.other, fmt.Sprintf("%s: %v", reason, err))
}

func TestWindowMatchesBruteForce(t *testing.T) {
	var totalRows, totalLate int
	defer func() {
		// The streams must exercise both paths, or the test proves little.
		if !t.Failed() && (totalRows < 1000 || totalLate < 100) {
			t.Fatalf("weak streams: %d rows, %d late records in all seeds", totalRows, totalLate)
		}
		t.Logf("%d window rows and %d late records checked", totalRows, totalLate)
	}()
	for seed := int64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewSource(seed))
		kind := "tumbling"
		size := int64(100 * (1 + rng.Intn(20)))
		slide := size
		if seed%2 == 0 {
			kind = "sliding"
			slide = int64(50 * (1 + rng.Intn(int(size/50))))
		}
		evs := randomStream(rng, 50+rng.Intn(300), 1+rng.Intn(6), int64(rng.Intn(3000)))
		wantRows, wantLate := refWindows(evs, size, slide)
		totalRows += len(wantRows)
		totalLate += len(wantLate)

		for _, onUpdate := range []bool{false, true} {
			step := NewWindow(windowSpec(t, kind, size, slide, onUpdate))
			c := &lateCollect{}
			if onUpdate {
				c.lastRow = map[string]string{}
			}
			for i, e := range evs {
				// Now and then checkpoint and recover into a fresh step:
				// the results must not notice.
				if rng.Intn(40) == 0 {
					var sw snapWriter
					if err := step.(Stateful).Snapshot(&sw); err != nil {
						t.Fatal(err)
					}
					step = NewWindow(windowSpec(t, kind, size, slide, onUpdate))
					if err := step.(Stateful).Restore(&sw); err != nil {
						t.Fatalf("seed %d: restore: %v", seed, err)
					}
				}
				if e.advance {
					n := len(c.rows)
					step.(Timed).Advance(e.wm, c)
					c.after += len(c.rows) - n
					continue
				}
				r := e.record(i)
				if _, err := step.ShuffleKey(r); err != nil {
					t.Fatal(err)
				}
				step.Process(r, c)
			}
			n := len(c.rows)
			step.(Timed).Advance(math.MaxInt64, c)
			c.after += len(c.rows) - n

			if len(c.other) > 0 {
				t.Fatalf("seed %d: unexpected dead letters: %v", seed, c.other)
			}
			if !slices.Equal(c.late, wantLate) {
				t.Fatalf("seed %d %s size=%d slide=%d on_update=%v: late %v, want %v", seed, kind, size, slide, onUpdate, c.late, wantLate)
			}
			if st := step.(*window); st.OpenWindows() != 0 {
				t.Fatalf("seed %d: %d windows still open after the final advance", seed, st.OpenWindows())
			}
			if !onUpdate {
				if !slices.Equal(c.rows, wantRows) {
					t.Fatalf("seed %d %s size=%d slide=%d: %d rows, want %d\nfirst diff: %s", seed, kind, size, slide, len(c.rows), len(wantRows), firstDiff(c.rows, wantRows))
				}
				continue
			}
			if c.after != 0 {
				t.Fatalf("seed %d: on_update emitted %d rows at close", seed, c.after)
			}
			var got []string
			for _, r := range wantRows {
				v, _ := jsoncodec.Decode([]byte(r))
				m := v.(map[string]any)
				got = append(got, c.lastRow[fmt.Sprintf("%v/%v", m["window_end"], m["key"])])
			}
			if len(c.lastRow) != len(wantRows) || !slices.Equal(got, wantRows) {
				t.Fatalf("seed %d on_update: last rows differ: %s", seed, firstDiff(got, wantRows))
			}
		}
	}
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("#%d\n got  %s\n want %s", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("lengths %d vs %d", len(a), len(b))
}

// refDedup is the brute-force model of drop_duplicates: a plain map from
// key to the event time of the record that passed.
func refDedup(evs []event, ttl int64) []bool {
	seen := map[string]int64{}
	var out []bool
	for _, e := range evs {
		if e.advance {
			if ttl > 0 {
				for k, p := range seen {
					if p+ttl <= e.wm {
						delete(seen, k)
					}
				}
			}
			continue
		}
		p, ok := seen[e.key]
		pass := !ok || (ttl > 0 && e.t >= p+ttl)
		if pass {
			seen[e.key] = e.t
		}
		out = append(out, pass)
	}
	return out
}

type passCollect struct {
	passed map[int64]bool
	other  []string
}

func (c *passCollect) Emit(r *Record) { c.passed[r.Offset] = true }
func (c *passCollect) DeadLetter(r *Record, reason Reason, err error) {
	c.other = append(c.other, fmt.Sprintf("%s: %v", reason, err))
}

func TestDropDuplicatesMatchesBruteForce(t *testing.T) {
	key, err := CompileExpr("value.user", nil)
	if err != nil {
		t.Fatal(err)
	}
	var passes, drops, repasses int
	defer func() {
		if !t.Failed() && (passes < 1000 || drops < 1000 || repasses < 100) {
			t.Fatalf("weak streams: %d passes, %d drops, %d passes of a key seen before", passes, drops, repasses)
		}
		t.Logf("%d passes, %d drops, %d passes of a key seen before", passes, drops, repasses)
	}()
	for seed := int64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewSource(seed))
		evs := randomStream(rng, 50+rng.Intn(400), 1+rng.Intn(30), int64(rng.Intn(3000)))
		var ttl int64
		if seed%3 != 0 {
			ttl = int64(1 + rng.Intn(3000))
		}
		want := refDedup(evs, ttl)
		seenKey := map[string]bool{}
		j := 0
		for _, e := range evs {
			if e.advance {
				continue
			}
			switch {
			case !want[j]:
				drops++
			case seenKey[e.key]:
				repasses++
				passes++
			default:
				passes++
			}
			seenKey[e.key] = true
			j++
		}
		kv := NewMemKV()
		step := NewDropDuplicates(key, time.Duration(ttl)*time.Millisecond, kv)
		c := &passCollect{passed: map[int64]bool{}}
		var got []bool
		for i, e := range evs {
			if e.advance {
				if ts, ok := step.(Timed); ok {
					ts.Advance(e.wm, c)
				} else if ttl > 0 {
					t.Fatalf("seed %d: drop_duplicates with a ttl is not Timed", seed)
				}
				continue
			}
			r := e.record(i)
			if _, err := step.ShuffleKey(r); err != nil {
				t.Fatal(err)
			}
			step.Process(r, c)
			got = append(got, c.passed[int64(i)])
		}
		if len(c.other) > 0 {
			t.Fatalf("seed %d: dead letters: %v", seed, c.other)
		}
		if !slices.Equal(got, want) {
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("seed %d ttl=%d: record #%d passed=%v, want %v", seed, ttl, i, got[i], want[i])
				}
			}
		}
		// Invariant 1: with a ttl every "k" entry has its "t" entry.
		nk, nt := 0, 0
		_ = kv.Scan(nil, nil, func(k, v []byte) bool {
			if k[0] == 'k' {
				nk++
				if ttl > 0 {
					tk := append(putTime([]byte{'t'}, getTime(v)), k[1:]...)
					if _, ok, _ := kv.Get(tk); !ok {
						t.Fatalf("seed %d: key %q has no index entry", seed, k[1:])
					}
				}
			} else {
				nt++
			}
			return true
		})
		if ttl > 0 && nk != nt {
			t.Fatalf("seed %d: %d keys but %d index entries", seed, nk, nt)
		}
		// Bounded state: once the watermark passes everything, nothing is left.
		if ts, ok := step.(Timed); ok {
			ts.Advance(math.MaxInt64, c)
		}
		if ttl > 0 && kv.Len() != 0 {
			t.Fatalf("seed %d: %d KV entries left after the final advance", seed, kv.Len())
		}
	}
}
