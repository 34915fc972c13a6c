package jsoncodec

import (
	"encoding/json"
	"strings"
	"testing"
)

// checkScanAgrees fails t unless the fast scanner and the checked one
// agree on s[i:]: both accept and end at the same byte, or both refuse.
// The fast one may not accept what the checked one refuses; refusing what
// it accepts would only cost time, but is a bug all the same.
func checkScanAgrees(t *testing.T, s string, i int) {
	t.Helper()
	fast := scanValue(s, i, 0)
	d := &jsonDecoder{s: s, i: i}
	d.skipChecked(0)
	if d.err != nil {
		if fast >= 0 {
			t.Fatalf("%q at %d: scanValue accepts (to %d), the checked scanner refuses: %v", s, i, fast, d.err)
		}
		return
	}
	if fast != d.i {
		t.Fatalf("%q at %d: scanValue ends at %d, the checked scanner at %d", s, i, fast, d.i)
	}
}

// checkSameAsDecode fails t unless DecodeMembers gives doc Decode's
// verdict, with the same error when it refuses it, and that verdict is
// encoding/json's (the scanners share strStops with Decode, so agreeing
// with each other alone would not catch a fault there).
func checkSameAsDecode(t *testing.T, doc string) {
	t.Helper()
	_, ferr := Decode([]byte(doc))
	var v any
	if jerr := json.Unmarshal([]byte(doc), &v); (jerr == nil) != (ferr == nil) {
		t.Fatalf("%q: Decode %v, encoding/json %v", doc, ferr, jerr)
	}
	_, _, perr := DecodeMembers([]byte(doc), Fields{"b": {}})
	if (ferr == nil) != (perr == nil) || ferr != nil && ferr.Error() != perr.Error() {
		t.Fatalf("%q: Decode %v, DecodeMembers %v", doc, ferr, perr)
	}
}

// TestScanStringEveryPosition: the 16-byte scan of a skipped string (two
// words a turn, then one word, then bytes) finds a closing quote, an
// escape (good or bad), a control character or a non-ASCII byte wherever
// it sits in a block, in strings shorter and longer than a block, and with
// the input cut at every byte; the fast scanner agrees with the checked
// one, and DecodeMembers with Decode, error text and offset included.
func TestScanStringEveryPosition(t *testing.T) {
	specials := []string{`"`, `\"`, `\\`, `\/`, `\b`, `\n`, `\u00e9`, `\uD83D\uDE00`, `\u12`, `\uZZZZ`, `\u00g0`, `\x`, `\`,
		"\x00", "\x01", "\x1f", "\x7f", " ", "é", "\xff", "\x80", "\xc3", "\"\"", `\\"`}
	for _, sp := range specials {
		for p := 0; p <= 40; p++ {
			for _, tail := range []int{0, 1, 7, 8, 9, 15, 16, 17, 33} {
				body := strings.Repeat("x", p) + sp + strings.Repeat("y", tail)
				for _, doc := range []string{
					`{"a":"` + body + `","b":1}`,
					`{"b":1,"a":"` + body + `"}`,
					`{"a":["` + body + `"]}`,
					`{"` + body + `":1}`, // a top-level key (decoded, not skipped)
					`{"a":{"` + body + `":1}}`,
				} {
					checkSameAsDecode(t, doc)
					checkScanAgrees(t, doc, 5)
				}
			}
		}
	}
}

// TestScanCutEverywhere: every prefix of documents with every kind of
// value, skipped: the input ending inside a string, a number, a literal,
// an escape or between tokens.
func TestScanCutEverywhere(t *testing.T) {
	docs := []string{
		`{"b":1,"a":{"k":"v","n":-12.5e+3,"t":true,"f":false,"z":null,"l":[1,[2,{}],"s\"\\\u00e9",0,-0.0,1E9]}}`,
		`{"b":1,"a":"` + strings.Repeat("abcdefghijklmnop", 5) + `\n` + strings.Repeat("q", 21) + `"}`,
		"{\"b\":1 , \"a\" :\t[ 1 ,\n2\r, { \"x\" : \"y\" } ] }",
		`{"b":1,"a":12345678901234567890123}`,
		`{"b":1,"a":1e400}`,
		`{"b":1,"a":-1e-400}`,
		`{"b":1,"a":123456789012345}`,
		`{"b":1,"a":0.12345678901234567}`,
	}
	for _, doc := range docs {
		for k := 0; k <= len(doc); k++ {
			checkSameAsDecode(t, doc[:k])
			if k > 5 {
				checkScanAgrees(t, doc[:k], 5)
			}
		}
	}
}

// TestScanRefusesWhatDecodeRefuses: values the fast scanner must refuse,
// and some it must accept, each at every nesting the test puts it.
func TestScanRefusesWhatDecodeRefuses(t *testing.T) {
	for _, v := range []string{
		`01`, `-`, `-a`, `1.`, `1.e5`, `1e`, `1e+`, `.5`, `+1`, `1.5E-`, `0x10`, `Infinity`, `NaN`, `1_000`,
		`tru`, `truE`, `fals`, `nul`, `nulll`, `t`, `[1,]`, `[,1]`, `{,}`, `{"a"}`, `{"a":}`, `{"a" 1}`, `{"a":1,}`,
		`{1:2}`, `{"a":1 "b":2}`, `[1 2]`, `[`, `{`, `]`, `}`, `"\u"`, `"\'"`, "\"\t\"", `[[]`, `[]]`,
		`0`, `-0`, `1e400`, `1E-400`, `[1e308,1e309]`, `1.7976931348623157e308`, `"\ud800"`, "\"\xff\"",
		strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1),
		strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth),
		strings.Repeat(`{"a":`, maxDepth) + "1" + strings.Repeat("}", maxDepth),
	} {
		for _, doc := range []string{`{"b":1,"a":` + v + `}`, `{"a":` + v + `,"b":1}`, `{"a":[` + v + `]}`, `{"a": ` + v + ` }`} {
			checkSameAsDecode(t, doc)
			checkScanAgrees(t, doc, strings.IndexByte(doc, ':')+1)
		}
	}
}
