package jsoncodec

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// membersOf splits the fuzzer's want string into member names.
func membersOf(s string) Fields {
	f := Fields{}
	for _, k := range strings.Split(s, ",") {
		f[k] = struct{}{}
	}
	return f
}

// FuzzDecodeMembers: DecodeMembers refuses exactly what Decode refuses,
// with the same error; what it keeps equals Decode's members; and
// SpliceMembers of the kept members, changed, decodes to Decode's object
// with those changes.
func FuzzDecodeMembers(f *testing.F) {
	for _, s := range []struct{ doc, want string }{
		{`{"a":1,"b":{"c":[1,2,{"d":"x"}]},"e":"\u00e9\n"}`, "a,e"},
		{`{"a":1,"a":2,"b":true}`, "a"},
		{`{"a":1,"b":1e400}`, "a"},
		{`{"a":1,"b":"\x01"}`, "a"},
		{`{"a":1,"b":"\uZZZZ"}`, "a"},
		{`{"a":1,"b":[1,2,]}`, "a"},
		{`{"a":1,"b":01}`, "a"},
		{`{"a":1,"b":{"c":1 "d":2}}`, "a"},
		{`{"a":1,"b":"ok"} x`, "b"},
		{`[1,2,3]`, "a"},
		{`"just a string"`, "a"},
		{`{"x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`, "a"},
		{"{\"a\":\"\xff\",\"b\":\"\xfe\\\"\"}", "a,b"},
		{` { "a" : 1 , "b" : [ ] , "c" : { } } `, "c,zz"},
		{`{"a":12345678901234567890123,"b":-0.5e-3}`, "b"},
		{`{"a":"0123456789abcdef0123456789\"abcdef\u00e9","b":"0123456789abcdef0123456789abcdef\x"}`, "zz"},
		{"{\"a\":1,\"b\":\"0123456789abcdef0123456789abc\x1f\"}", "a"},
	} {
		f.Add([]byte(s.doc), s.want)
	}
	f.Fuzz(func(t *testing.T, b []byte, wantS string) {
		// The fast skip scanner (scan.go) agrees with the checked one, on
		// the whole input and from its first member's value on.
		if len(b) > 0 {
			checkScanAgrees(t, string(b), 0)
			if c := bytes.IndexByte(b, ':'); c >= 0 && c+1 < len(b) {
				checkScanAgrees(t, string(b), c+1)
			}
		}
		want := membersOf(wantS)
		full, ferr := Decode(b)
		part, partial, perr := DecodeMembers(b, want)
		if (ferr == nil) != (perr == nil) {
			t.Fatalf("validity differs: Decode %v, DecodeMembers %v", ferr, perr)
		}
		if ferr != nil {
			if ferr.Error() != perr.Error() {
				t.Fatalf("errors differ:\n Decode        %v\n DecodeMembers %v", ferr, perr)
			}
			return
		}
		fm, isObj := full.(map[string]any)
		if partial != isObj {
			t.Fatalf("partial %v for a value that is an object: %v", partial, isObj)
		}
		if !isObj {
			if !reflect.DeepEqual(full, part) {
				t.Fatalf("a non-object value decoded differently: %#v vs %#v", full, part)
			}
			return
		}
		pm := part.(map[string]any)
		for k := range want {
			fv, inF := fm[k]
			pv, inP := pm[k]
			if inF != inP || !reflect.DeepEqual(fv, pv) {
				t.Fatalf("member %q: Decode %#v (%v), DecodeMembers %#v (%v)", k, fv, inF, pv, inP)
			}
		}
		if len(pm) > len(want) {
			t.Fatalf("DecodeMembers kept %d members for %d wanted", len(pm), len(want))
		}
		// Change what was kept, add a member, and splice.
		for k := range pm {
			pm[k] = []any{k, 1.5}
			fm[k] = pm[k]
		}
		pm["zz_added"], fm["zz_added"] = "new", "new"
		out, err := SpliceMembers(nil, b, pm)
		if err != nil {
			t.Fatalf("splice: %v", err)
		}
		got, err := Decode(out)
		if err != nil {
			t.Fatalf("the splice is not JSON: %v\n%s", err, out)
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(fm)
		if !bytes.Equal(g, w) {
			t.Fatalf("splice decodes to\n %s\nwant\n %s\n(splice %s)", g, w, out)
		}
	})
}

func TestDecodeMembersKeepsOnlyWanted(t *testing.T) {
	v, partial, err := DecodeMembers([]byte(`{"amount": 12.5, "card": {"country": "FR"}, "notes": "long text", "tags": [1, 2]}`),
		Fields{"amount": {}, "card": {}, "missing": {}})
	if err != nil || !partial {
		t.Fatalf("%v %v", partial, err)
	}
	want := map[string]any{"amount": 12.5, "card": map[string]any{"country": "FR"}}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("got %#v", v)
	}
	m := v.(map[string]any)
	m["amount"], m["risk"] = 3.0, "high"
	out, err := SpliceMembers(nil, []byte(`{"amount": 12.5, "card": {"country": "FR"}, "notes": "long text", "tags": [1, 2]}`), m)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(out); got != `{"amount":3,"card":{"country":"FR"},"notes": "long text","tags": [1, 2],"risk":"high"}` {
		t.Fatalf("splice: %s", got)
	}
}

// TestDecodeMembersOwnsItsStrings: nothing DecodeMembers returns is a view
// into the input, which it does not copy: a caller may reuse the buffer.
func TestDecodeMembersOwnsItsStrings(t *testing.T) {
	b := []byte(`{"user": "u-123", "tags": ["a", {"k": "v"}], "skip": "me", "n": "x"}`)
	v, _, err := DecodeMembers(b, Fields{"user": {}, "tags": {}, "n": {}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = '#'
	}
	want := map[string]any{"user": "u-123", "tags": []any{"a", map[string]any{"k": "v"}}, "n": "x"}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("after the buffer changed: %#v", v)
	}
}

// TestLongStringsAtEveryOffset: the 8-byte scan of strings (swar.go) finds
// a quote, an escape, a control character or a non-ASCII byte wherever it
// sits in a word, for Decode and for the skip scanner.
func TestLongStringsAtEveryOffset(t *testing.T) {
	for _, special := range []string{`\"`, `\\`, `\n`, `\u00e9`, "\x01", "\x1f", "é", "\xff", `"`} {
		for p := 0; p < 24; p++ {
			doc := []byte(`{"a":"` + strings.Repeat("x", p) + special + strings.Repeat("y", 19) + `","b":1}`)
			var want any
			werr := json.Unmarshal(doc, &want)
			got, err := Decode(doc)
			if (err == nil) != (werr == nil) {
				t.Fatalf("%q at %d: Decode %v, encoding/json %v", special, p, err, werr)
			}
			if err == nil {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(want)
				if !bytes.Equal(g, w) {
					t.Fatalf("%q at %d: %s, want %s", special, p, g, w)
				}
			}
			_, _, merr := DecodeMembers(doc, Fields{"b": {}})
			if (merr == nil) != (err == nil) {
				t.Fatalf("%q at %d: skipping gives %v, decoding %v", special, p, merr, err)
			}
		}
	}
}
