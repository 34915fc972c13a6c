package operators

import (
	"bytes"
	"testing"
	"time"
)

// FuzzWindowRestore: Restore of arbitrary bytes never panics, and what it
// accepts snapshots back to the same bytes.
func FuzzWindowRestore(f *testing.F) {
	step := NewWindow(windowSpec(f, "sliding", 1000, 500, false))
	step.Process(&Record{EventTime: 1200, Value: map[string]any{"user": "u1", "v": 3.0, "s": "x"}}, &oneDead{})
	step.Process(&Record{EventTime: 1300, Value: map[string]any{"user": "u2", "v": -1.0, "s": "y"}}, &oneDead{})
	var sw snapWriter
	if err := step.(Stateful).Snapshot(&sw); err != nil {
		f.Fatal(err)
	}
	f.Add(sw.keys[0], sw.vals[0], sw.keys[1], sw.vals[1])
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 []byte) {
		in := &snapWriter{keys: [][]byte{k1, k2}, vals: [][]byte{v1, v2}}
		w := NewWindow(windowSpec(t, "sliding", 1000, 500, false))
		if err := w.(Stateful).Restore(in); err != nil {
			return
		}
		var out snapWriter
		if err := w.(Stateful).Snapshot(&out); err != nil {
			t.Fatal(err)
		}
		// Process and Advance must work on whatever was restored.
		w.Process(&Record{EventTime: 1e6, Value: map[string]any{"user": "u1", "v": 1.0, "s": "z"}}, &oneDead{})
		w.(Timed).Advance(2e6, &oneDead{})
	})
}

// FuzzTables: the JSON-lines and CSV table readers never panic, report
// errors with a line number, and the table built from what they read (the
// encoded arena of FileTable) holds exactly the rows a map of the decoded
// rows holds.
func FuzzTables(f *testing.F) {
	f.Add([]byte("{\"id\":\"a\",\"v\":1}\n{\"id\":2}\n"), true)
	f.Add([]byte("id,v\na,1\nb,\"x,y\"\n"), false)
	f.Fuzz(func(t *testing.T, b []byte, jsonl bool) {
		path := "t.csv"
		if jsonl {
			path = "t.jsonl"
		}
		rows := map[string]map[string]any{}
		err := readTable(bytes.NewReader(b), path, "id", func(k string, row map[string]any) error {
			rows[k] = row
			return nil
		})
		if err != nil {
			if err.Error() == "" || err.Error()[0] < '0' || err.Error()[0] > '9' {
				t.Fatalf("error without a line number: %v", err)
			}
			return
		}
		ab := newArenaBuilder()
		if err := readTable(bytes.NewReader(b), path, "id", ab.add); err != nil {
			t.Fatalf("second read: %v", err)
		}
		checkSameRows(t, rows, ab.finish())
	})
}

// FuzzSessionRestore: a session window's Restore never panics on any
// snapshot entries; what it accepts is a valid state (each key's sessions
// disjoint and by start, every open session in the heap), which snapshots
// to the same entries and on which Process and Advance work.
func FuzzSessionRestore(f *testing.F) {
	spec := windowSpec(f, "session", 0, 0, false)
	spec.Gap, spec.MaxDuration = time.Second, 5*time.Second
	step := NewWindow(spec)
	for i, e := range []event{{key: "u1", t: 1200, v: 3, s: "x"}, {key: "u1", t: 4000, v: 1, s: "y"}, {key: "u2", t: 1300, v: -1, s: "z"}} {
		step.Process(e.record(i), &oneDead{})
	}
	var sw snapWriter
	if err := step.(Stateful).Snapshot(&sw); err != nil {
		f.Fatal(err)
	}
	f.Add(sw.keys[0], sw.vals[0], sw.keys[1], sw.vals[1], sw.keys[2], sw.vals[2])
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 []byte) {
		in := &snapWriter{keys: [][]byte{k1, k2, k3}, vals: [][]byte{v1, v2, v3}}
		w := NewWindow(spec)
		if err := w.(Stateful).Restore(in); err != nil {
			return
		}
		sw := w.(*sessionWindow)
		n := 0
		for key, s := range sw.byKey {
			for ; s != nil; s = s.next {
				n++
				if s.end <= s.start || s.end-s.start > sw.max || s.key != key || (s.next != nil && s.next.start < s.end) {
					t.Fatalf("restored an invalid session list of %q: [%d, %d) then %v", key, s.start, s.end, s.next)
				}
			}
		}
		if int64(n) != sw.open || len(sw.heap) != n {
			t.Fatalf("%d sessions listed, %d open, %d in the heap", n, sw.open, len(sw.heap))
		}
		var out snapWriter
		if err := w.(Stateful).Snapshot(&out); err != nil {
			t.Fatal(err)
		}
		if len(out.keys) != n+1 {
			t.Fatalf("snapshot of %d entries from %d sessions", len(out.keys), n)
		}
		w.Process(&Record{EventTime: 1e6, Value: map[string]any{"user": "u1", "v": 1.0, "s": "z"}}, &oneDead{})
		w.(Timed).Advance(1<<62, &oneDead{})
		if sw.open != 0 || len(sw.byKey) != 0 {
			t.Fatalf("%d sessions open after the last advance", sw.open)
		}
	})
}
