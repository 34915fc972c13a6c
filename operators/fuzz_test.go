package operators

import (
	"bytes"
	"testing"
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

// FuzzTables: the JSON-lines and CSV table readers never panic, and report
// errors with a line number.
func FuzzTables(f *testing.F) {
	f.Add([]byte("{\"id\":\"a\",\"v\":1}\n{\"id\":2}\n"), true)
	f.Add([]byte("id,v\na,1\nb,\"x,y\"\n"), false)
	f.Fuzz(func(t *testing.T, b []byte, jsonl bool) {
		var err error
		var rows map[string]map[string]any
		if jsonl {
			rows, err = readJSONLinesTable(bytes.NewReader(b), "id")
		} else {
			rows, err = readCSVTable(bytes.NewReader(b), "id")
		}
		if err == nil && rows == nil {
			t.Fatal("no error and no rows map")
		}
		if err != nil && (err.Error() == "" || err.Error()[0] < '0' || err.Error()[0] > '9') {
			t.Fatalf("error without a line number: %v", err)
		}
	})
}
