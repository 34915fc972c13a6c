package operators

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzDecodeJSON: DecodeJSON never panics, and agrees with encoding/json
// on what is valid and on the value it yields.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,"x",null,true]`, `"\u00e9"`, `1e400`, `{"a":{"b":[{}]}}`, `-0`, `{"a":1}{"b":2}`, `"a\u00e9\ud83d\ude00\ud800x\n\"\/\b\f\r\t\\"`, "\"\xff\xfe ok\"", `[1.5e-3,-0,123456789012345678901]`, ` {"k" : [ ] , "j":{}} `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeJSON(b)
		var want any
		werr := json.Unmarshal(b, &want)
		if (err == nil) != (werr == nil) {
			t.Fatalf("validity differs from encoding/json: %v vs %v", err, werr)
		}
		if err != nil {
			return
		}
		g, err1 := json.Marshal(got)
		w, err2 := json.Marshal(want)
		if err1 != nil || err2 != nil {
			t.Fatalf("re-encode: %v / %v", err1, err2)
		}
		if !bytes.Equal(g, w) {
			t.Fatalf("decoded differently:\n got  %s\n want %s", g, w)
		}
		// AppendJSON writes exactly what encoding/json writes.
		a, err := AppendJSON(nil, got)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, w) {
			t.Fatalf("AppendJSON differs from encoding/json:\n got  %s\n want %s", a, w)
		}
	})
}

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

// FuzzAppendJSONScalars: strings (any bytes) and numbers encode exactly as
// encoding/json encodes them.
func FuzzAppendJSONScalars(f *testing.F) {
	f.Add("plain", 1.5, int64(-3))
	f.Add("<a href=\"x\">&\u2028\u2029\x00\x1f\b\f\n\r\t\\\xff\xc3", 1e21, int64(1<<62))
	f.Add("é😀", 1e-7, int64(0))
	f.Add("", -0.000001, int64(-1))
	f.Fuzz(func(t *testing.T, s string, x float64, n int64) {
		v := map[string]any{s: []any{s, x, n, float32(x), true, nil}, "k": s}
		got, err := AppendJSON(nil, v)
		want, werr := json.Marshal(v)
		if (err == nil) != (werr == nil) {
			t.Fatalf("error differs: %v vs %v", err, werr)
		}
		if err == nil && !bytes.Equal(got, want) {
			t.Fatalf("AppendJSON differs from encoding/json:\n got  %s\n want %s", got, want)
		}
	})
}
