package jsoncodec

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzDecode: Decode never panics, and agrees with encoding/json on what
// is valid and on the value it yields.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,"x",null,true]`, `"\u00e9"`, `1e400`, `{"a":{"b":[{}]}}`, `-0`, `{"a":1}{"b":2}`, `"a\u00e9\ud83d\ude00\ud800x\n\"\/\b\f\r\t\\"`, "\"\xff\xfe ok\"", `[1.5e-3,-0,123456789012345678901]`, ` {"k" : [ ] , "j":{}} `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Decode(b)
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
		// Append writes exactly what encoding/json writes.
		a, err := Append(nil, got)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, w) {
			t.Fatalf("Append differs from encoding/json:\n got  %s\n want %s", a, w)
		}
	})
}

// FuzzAppendScalars: strings (any bytes) and numbers encode exactly as
// encoding/json encodes them.
func FuzzAppendScalars(f *testing.F) {
	f.Add("plain", 1.5, int64(-3))
	f.Add("<a href=\"x\">&\u2028\u2029\x00\x1f\b\f\n\r\t\\\xff\xc3", 1e21, int64(1<<62))
	f.Add("é😀", 1e-7, int64(0))
	f.Add("", -0.000001, int64(-1))
	f.Fuzz(func(t *testing.T, s string, x float64, n int64) {
		v := map[string]any{s: []any{s, x, n, float32(x), true, nil}, "k": s}
		got, err := Append(nil, v)
		want, werr := json.Marshal(v)
		if (err == nil) != (werr == nil) {
			t.Fatalf("error differs: %v vs %v", err, werr)
		}
		if err == nil && !bytes.Equal(got, want) {
			t.Fatalf("Append differs from encoding/json:\n got  %s\n want %s", got, want)
		}
	})
}
