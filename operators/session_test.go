package operators

import (
	"fmt"
	"math"
	"math/rand"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// refSessions is the brute-force model of session windows, from the rules
// in docs/RULES.md ("Session windows"): per key a list of sessions by
// start, each holding the indexes of its records; rows are recomputed from
// the records (refWindow.row). rows are what on_close emits; updates what
// on_update emits: after each record that is not late, the row of the
// session it is in then (after a merge, the merged session's: the rows of
// the sessions it absorbed were emitted before, and are not taken back);
// merges counts the records that merged sessions.
func refSessions(evs []event, gap, maxDur int64) (rows []string, late []int, updates []string, merges int) {
	type sess struct {
		start, end int64
		members    []int
	}
	open := map[string][]*sess{}
	rowOf := func(key string, s *sess) string {
		w := &refWindow{start: s.start, end: s.end, key: key}
		idx := slices.Clone(s.members)
		slices.Sort(idx)
		for _, i := range idx {
			w.members = append(w.members, evs[i])
		}
		b, _ := jsoncodec.Append(nil, w.row())
		return string(b)
	}
	var wm int64
	hasWM := false
	closeUpTo := func(to int64) {
		type closed struct {
			key string
			s   *sess
		}
		var cs []closed
		for k, list := range open {
			var kept []*sess
			for _, s := range list {
				if s.end <= to {
					cs = append(cs, closed{k, s})
				} else {
					kept = append(kept, s)
				}
			}
			open[k] = kept
		}
		slices.SortFunc(cs, func(a, b closed) int {
			switch {
			case a.s.end != b.s.end:
				return int(a.s.end - b.s.end)
			case a.key != b.key:
				if a.key < b.key {
					return -1
				}
				return 1
			}
			return int(a.s.start - b.s.start)
		})
		for _, c := range cs {
			rows = append(rows, rowOf(c.key, c.s))
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
		list := open[e.key]
		var meet []int
		for j, s := range list {
			if s.start < e.t+gap && e.t < s.end {
				meet = append(meet, j)
			}
		}
		into, to := -1, -1
		start, end := e.t, e.t+gap
		if len(meet) > 0 {
			lo, hi := min(e.t, list[meet[0]].start), max(e.t+gap, list[meet[len(meet)-1]].end)
			if maxDur == 0 || hi-lo <= maxDur {
				into, to, start, end = meet[0], meet[len(meet)-1], lo, hi
			} else {
				for _, j := range meet {
					if s := list[j]; s.start <= e.t && e.t < s.end {
						end = max(s.end, min(e.t+gap, s.start+maxDur))
						if j+1 < len(list) {
							end = min(end, list[j+1].start)
						}
						into, to, start = j, j, s.start
					}
				}
				if into < 0 {
					end = min(e.t+gap, list[meet[0]].start)
				}
			}
		}
		if hasWM && end <= wm {
			late = append(late, i)
			continue
		}
		var s *sess
		if into < 0 {
			at := 0
			for at < len(list) && list[at].start < e.t {
				at++
			}
			s = &sess{start: start, end: end, members: []int{i}}
			list = slices.Insert(list, at, s)
		} else {
			s = list[into]
			if to > into {
				merges++
			}
			for _, o := range list[into+1 : to+1] {
				s.members = append(s.members, o.members...)
			}
			list = slices.Delete(list, into+1, to+1)
			s.start, s.end = start, end
			s.members = append(s.members, i)
		}
		open[e.key] = list
		updates = append(updates, rowOf(e.key, s))
	}
	closeUpTo(math.MaxInt64)
	return rows, late, updates, merges
}

// TestSessionMatchesBruteForce: random out-of-order streams with late
// records through the session window (all eight aggregates, with and
// without max_duration, on_close and on_update), snapshotted and restored
// into a fresh step now and then, against refSessions.
func TestSessionMatchesBruteForce(t *testing.T) {
	var totalRows, totalLate, multi, totalMerges int
	defer func() {
		if !t.Failed() && (totalRows < 1000 || totalLate < 100 || multi < 100 || totalMerges < 100) {
			t.Fatalf("weak streams: %d rows, %d late records, %d sessions of several records, %d merges in all seeds", totalRows, totalLate, multi, totalMerges)
		}
		t.Logf("%d session rows, %d late records, %d sessions of several records, %d merges checked", totalRows, totalLate, multi, totalMerges)
	}()
	for seed := int64(1); seed <= 120; seed++ {
		rng := rand.New(rand.NewSource(seed))
		gap := int64(50 * (1 + rng.Intn(20)))
		var maxDur int64
		if seed%2 == 0 {
			maxDur = gap * int64(1+rng.Intn(6))
		}
		evs := randomStream(rng, 50+rng.Intn(300), 1+rng.Intn(6), int64(rng.Intn(3000)))
		wantRows, wantLate, wantUpdates, merges := refSessions(evs, gap, maxDur)
		totalMerges += merges
		totalRows += len(wantRows)
		totalLate += len(wantLate)
		spec := func(onUpdate bool) WindowSpec {
			s := windowSpec(t, "session", 0, 0, onUpdate)
			s.Gap, s.MaxDuration = time.Duration(gap)*time.Millisecond, time.Duration(maxDur)*time.Millisecond
			return s
		}
		for _, onUpdate := range []bool{false, true} {
			step := NewWindow(spec(onUpdate))
			c := &lateCollect{}
			last := map[string]string{}
			for i, e := range evs {
				if rng.Intn(40) == 0 {
					var sw snapWriter
					if err := step.(Stateful).Snapshot(&sw); err != nil {
						t.Fatal(err)
					}
					step = NewWindow(spec(onUpdate))
					if err := step.(Stateful).Restore(&sw); err != nil {
						t.Fatalf("seed %d: restore: %v", seed, err)
					}
				}
				if e.advance {
					n := len(c.rows)
					closes := step.(Closer).ClosesAt(e.wm)
					step.(Timed).Advance(e.wm, c)
					c.after += len(c.rows) - n
					if !onUpdate && closes != (len(c.rows) > n) {
						t.Fatalf("seed %d: ClosesAt(%d) said %v, Advance emitted %d rows", seed, e.wm, closes, len(c.rows)-n)
					}
					continue
				}
				r := e.record(i)
				if _, err := step.ShuffleKey(r); err != nil {
					t.Fatal(err)
				}
				n := len(c.rows)
				step.Process(r, c)
				for _, row := range c.rows[n:] {
					v, _ := jsoncodec.Decode([]byte(row))
					m := v.(map[string]any)
					last[fmt.Sprintf("%v/%v/%v", m["key"], m["window_start"], m["window_end"])] = row
				}
			}
			n := len(c.rows)
			step.(Timed).Advance(math.MaxInt64, c)
			c.after += len(c.rows) - n
			if len(c.other) > 0 {
				t.Fatalf("seed %d: unexpected dead letters: %v", seed, c.other)
			}
			if !slices.Equal(c.late, wantLate) {
				t.Fatalf("seed %d gap=%d max=%d on_update=%v: late %v, want %v", seed, gap, maxDur, onUpdate, c.late, wantLate)
			}
			sw := step.(*sessionWindow)
			if sw.open != 0 || len(sw.byKey) != 0 || len(sw.heap) != 0 {
				t.Fatalf("seed %d: %d sessions, %d keys, %d heap slots left after the final advance", seed, sw.open, len(sw.byKey), len(sw.heap))
			}
			if !onUpdate {
				if !slices.Equal(c.rows, wantRows) {
					t.Fatalf("seed %d gap=%d max=%d: %d rows, want %d\nfirst diff: %s", seed, gap, maxDur, len(c.rows), len(wantRows), firstDiff(c.rows, wantRows))
				}
				continue
			}
			if c.after != 0 {
				t.Fatalf("seed %d: on_update emitted %d rows at close", seed, c.after)
			}
			// Every row, in order: one per record that is not late, the
			// row of its session then; a merge emits the merged
			// session's row and takes back none of the rows of the
			// sessions it absorbed (docs/RULES.md, Session windows).
			if !slices.Equal(c.rows, wantUpdates) {
				t.Fatalf("seed %d gap=%d max=%d on_update: %d rows, want %d\nfirst diff: %s", seed, gap, maxDur, len(c.rows), len(wantUpdates), firstDiff(c.rows, wantUpdates))
			}
			// The last update of each final session is its row.
			var got []string
			for _, r := range wantRows {
				v, _ := jsoncodec.Decode([]byte(r))
				m := v.(map[string]any)
				got = append(got, last[fmt.Sprintf("%v/%v/%v", m["key"], m["window_start"], m["window_end"])])
			}
			if !slices.Equal(got, wantRows) {
				t.Fatalf("seed %d gap=%d max=%d on_update: last rows differ: %s", seed, gap, maxDur, firstDiff(got, wantRows))
			}
		}
		// Sessions of more than one record (joined or merged) are what
		// this test is about: count them.
		for _, r := range wantRows {
			v, _ := jsoncodec.Decode([]byte(r))
			if v.(map[string]any)["n"].(float64) > 1 {
				multi++
			}
		}
	}
}

// TestSessionResume: after a restore, the close journal's watermark closes
// the restored sessions that had closed before the crash without a row; a
// replayed record of such a session (at or below the journal's applied
// offset) is skipped silently, a new one behind the watermark is late, and
// the sessions still open go on.
func TestSessionResume(t *testing.T) {
	spec := windowSpec(t, "session", 0, 0, false)
	spec.Gap = 10 * time.Second
	step := NewWindow(spec)
	c := &lateCollect{}
	for i, e := range []event{
		{key: "a", t: 0}, {key: "a", t: 5000}, // [0, 15s)
		{key: "b", t: 20000}, // [20s, 30s)
	} {
		r := e.record(i)
		r.Partition = 0
		step.Process(r, c)
	}
	var sw snapWriter
	if err := step.(Stateful).Snapshot(&sw); err != nil {
		t.Fatal(err)
	}
	// After the checkpoint the watermark closed a's session, and the
	// process died. The new owner restores the checkpoint and the journal.
	fresh := NewWindow(spec)
	if err := fresh.(Stateful).Restore(&sw); err != nil {
		t.Fatal(err)
	}
	fresh.(Closer).Resume(15000, map[int32]int64{0: 3})
	if got := fresh.(StateSizer).StateKeys(); got != 1 {
		t.Fatalf("%d sessions open after Resume, want 1 (b's)", got)
	}
	c = &lateCollect{}
	replay := event{key: "a", t: 4000}.record(3) // offset 3: applied before the crash
	replay.Partition = 0
	fresh.Process(replay, c)
	late := event{key: "a", t: 4000}.record(4)
	late.Partition = 0
	fresh.Process(late, c)
	joins := event{key: "b", t: 25000}.record(5)
	joins.Partition = 0
	fresh.Process(joins, c)
	fresh.(Timed).Advance(1<<40, c)
	if !slices.Equal(c.late, []int{4}) || len(c.other) > 0 {
		t.Errorf("late %v, other dead letters %v; want only offset 4 late", c.late, c.other)
	}
	want := `{"distinct_s":1,"first_s":"","hi":0,"key":"b","last_s":"","lo":0,"mean":0,"n":2,"total":0,"window_end":35000,"window_start":20000}`
	if len(c.rows) != 1 || c.rows[0] != want {
		t.Errorf("rows %v, want only b's session:\n%s", c.rows, want)
	}
}

// TestOpenSessionsAreBounded: each open session counts against
// limits.max_open_windows; past it a record that would open one is a dead
// letter with reason budget, while records joining or merging open
// sessions still count, and closing sessions frees their place.
func TestOpenSessionsAreBounded(t *testing.T) {
	defer SetLimits(Limits{})
	SetLimits(Limits{OpenWindows: 3})
	spec := windowSpec(t, "session", 0, 0, false)
	spec.Gap = 10 * time.Second
	w := NewWindow(spec)
	c := &lateCollect{}
	for i, e := range []event{{key: "a", t: 0}, {key: "a", t: 18000}, {key: "b", t: 0}} {
		w.Process(e.record(i), c)
	}
	var dead []string
	sink := &deadSink{}
	w.Process(event{key: "c", t: 0}.record(3), sink)    // a fourth session: refused
	w.Process(event{key: "a", t: 9000}.record(4), sink) // merges a's two: accepted
	w.Process(event{key: "c", t: 0}.record(5), sink)    // one is free again
	dead = sink.dead
	if len(dead) != 1 || !strings.HasPrefix(dead[0], "budget: ") || !strings.Contains(dead[0], "limits.max_open_windows") {
		t.Fatalf("dead letters %q, want the fourth session's only, reason budget", dead)
	}
	if got := w.(StateSizer).StateKeys(); got != 3 {
		t.Errorf("%d sessions open, want 3", got)
	}
	w.(Timed).Advance(1<<40, c)
	if got := w.(StateSizer).StateKeys(); got != 0 {
		t.Errorf("%d sessions open after every one closed", got)
	}
}

// TestSessionStateIsCompact: an open session holds at most 200 bytes of
// heap besides its accumulators (issue 27): its struct, its key's map
// entry and bytes, and its heap slot, measured over 50k sessions of
// distinct keys as they come from records.
func TestSessionStateIsCompact(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	if n := unsafe.Sizeof(session{}); n > 80 {
		t.Errorf("a session is %d bytes, more than its 80-byte size class", n)
	}
	spec := windowSpec(t, "session", 0, 0, false)
	spec.Aggregates = spec.Aggregates[:1] // count()
	spec.Gap = time.Hour
	const n = 50_000
	runtime.GC()
	before := liveHeap()
	w := NewWindow(spec)
	c := &lateCollect{}
	for i := range n {
		// The key string is made here, as a decoder makes it, so the
		// bytes the session keeps count; the value is garbage after.
		w.Process(&Record{EventTime: int64(i), Value: map[string]any{"user": fmt.Sprintf("user-%06d", i)}}, c)
	}
	runtime.GC()
	per := float64(liveHeap()-before)/n - float64(unsafe.Sizeof(acc{}))
	runtime.KeepAlive(w)
	if got := w.(StateSizer).StateKeys(); got != n {
		t.Fatalf("%d sessions open, want %d", got, n)
	}
	t.Logf("%.0f bytes of heap per open session besides its accumulator", per)
	if per > 200 {
		t.Errorf("%.0f bytes per open session besides its accumulator, want at most 200", per)
	}
}
