package operators

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"unsafe"
)

// The decimal fast path (n / 10^frac) must give exactly ParseFloat's bits.
func TestDecodeJSONNumbersMatchParseFloat(t *testing.T) {
	cases := []string{"0", "-0", "-0.0", "0.0", "1", "1023", "1024", "-1", "19.99", "5.5", "0.137",
		"0.000000000000001", "123456789012345", "12345678901234.5", "1234567890123456",
		"9007199254740993", "0.1", "0.3", "2.675", "1e3", "1.5E-3", "-123.456e+2",
		"1.7976931348623157e308", "4.9e-324", "999999999999999.9", "0.30000000000000004"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		intDigits := 1 + rng.IntN(15)
		frac := rng.IntN(16)
		s := strconv.FormatUint(rng.Uint64N(uint64(math.Pow10(intDigits))), 10)
		if frac > 0 {
			f := strconv.FormatUint(rng.Uint64N(uint64(math.Pow10(frac))), 10)
			for len(f) < frac {
				f = "0" + f
			}
			s += "." + f
		}
		if rng.IntN(2) == 0 {
			s = "-" + s
		}
		cases = append(cases, s)
	}
	for _, s := range cases {
		got, err := DecodeJSON([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		want, _ := strconv.ParseFloat(s, 64)
		if g, ok := got.(float64); !ok || math.Float64bits(g) != math.Float64bits(want) {
			t.Fatalf("%s decoded to %v (%T), ParseFloat says %v", s, got, got, want)
		}
	}
}

// Strings and numbers from the intern caches are the right values, however
// the slots collide and repeat: many documents over a small alphabet
// against encoding/json.
func TestDecodeJSONInternedValues(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	words := make([]string, 2000) // more than the slots, so slots collide
	for i := range words {
		words[i] = fmt.Sprintf("w%d", rng.IntN(3000))
	}
	words = append(words, "", "a\\u00e9", `q\"x`, "<&>", "é", "a-32-byte-string-of-exactly-32b!", "a-33-byte-string-of-exactly-33by!")
	nums := []string{"0", "-0", "1", "255", "1023", "1024", "1.5", "-1.5", "19.99", "3e2", "0.137"}
	for range 3000 {
		var b bytes.Buffer
		b.WriteString("{")
		for j := range 1 + rng.IntN(12) {
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"k%d":`, j)
			if rng.IntN(3) == 0 {
				b.WriteString(nums[rng.IntN(len(nums))])
			} else {
				fmt.Fprintf(&b, `"%s"`, words[rng.IntN(len(words))])
			}
		}
		b.WriteString("}")
		got, err := DecodeJSON(b.Bytes())
		if err != nil {
			t.Fatalf("%s: %v", b.Bytes(), err)
		}
		var want any
		if err := json.Unmarshal(b.Bytes(), &want); err != nil {
			t.Fatal(err)
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if !bytes.Equal(g, w) {
			t.Fatalf("%s:\n got  %s\n want %s", b.Bytes(), g, w)
		}
	}
}

// -0 keeps its sign (encoding/json writes it as -0), small integers come
// from the shared table.
func TestDecodeJSONNegativeZero(t *testing.T) {
	for range 3 { // the second and third time through the caches
		v, err := DecodeJSON([]byte(`[-0, 0, -0.0, 0.0, 1, 1023.0, 1024]`))
		if err != nil {
			t.Fatal(err)
		}
		a := v.([]any)
		for i, neg := range []bool{true, false, true, false, false, false, false} {
			if math.Signbit(a[i].(float64)) != neg {
				t.Fatalf("element %d = %v: sign bit %v, want %v", i, a[i], !neg, neg)
			}
		}
		if out, _ := AppendJSON(nil, v); string(out) != `[-0,0,-0,0,1,1023,1024]` {
			t.Fatalf("re-encoded as %s", out)
		}
	}
}

// An interned string is a copy: the cache never holds on to a record's
// bytes, and only a string seen twice in a row at its slot is admitted.
func TestInternStringOwnsItsBytes(t *testing.T) {
	var c internCache
	buf := string([]byte(`xx"settled"xx`))
	view := buf[3:10]
	if v := c.boxString(view, true); v.(string) != "settled" || unsafe.StringData(v.(string)) != unsafe.StringData(view) {
		t.Fatalf("first sight: got %q, want the view itself (no copy yet)", v)
	}
	v := c.boxString(view, true)
	if v.(string) != "settled" || unsafe.StringData(v.(string)) == unsafe.StringData(view) {
		t.Fatalf("second sight: got %q sharing the record's bytes", v)
	}
	again := c.boxString(buf[3:10], true)
	if unsafe.StringData(again.(string)) != unsafe.StringData(v.(string)) {
		t.Fatal("third sight did not reuse the interned box")
	}
	long := string(bytes.Repeat([]byte("y"), internMaxLen+1))
	c.boxString(long, true)
	if got := c.boxString(long, true).(string); unsafe.StringData(got) != unsafe.StringData(long) {
		t.Fatal("a string longer than internMaxLen was copied")
	}
}

// Decoding repeated values allocates less than decoding distinct ones, and
// a pooled decoder starts clean after a failed document.
func TestDecodeJSONReusesBoxes(t *testing.T) {
	if _, err := DecodeJSON([]byte(`{"a":[1,2,{"b":"x","c":[3,`)); err == nil {
		t.Fatal("truncated document accepted")
	}
	v, err := DecodeJSON([]byte(`{"x":[3,{"y":"z"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := AppendJSON(nil, v); string(out) != `{"x":[3,{"y":"z"}]}` {
		t.Fatalf("after a failed document: %s", out)
	}
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	same := []byte(`["EUR","settled","DE","visa","android",19.99,0.137,5.5]`)
	i := 0
	distinct := func() []byte {
		i++
		return fmt.Appendf(nil, `["E%d","s%d","D%d","v%d","a%d",%d.99,0.%d,%d.5]`, i, i, i, i, i, i, i, i)
	}
	docs := make([][]byte, 200)
	for k := range docs {
		docs[k] = distinct()
	}
	k := 0
	aSame := testing.AllocsPerRun(200, func() { _, _ = DecodeJSON(same) })
	aDistinct := testing.AllocsPerRun(200, func() { _, _ = DecodeJSON(docs[k%len(docs)]); k++ })
	// distinct: the input copy, the slice, 5 strings, 3 numbers; same: the
	// input copy and the slice.
	if aSame > 3 || aDistinct < 9 {
		t.Fatalf("allocations per decode: %v with repeated values, %v with distinct ones", aSame, aDistinct)
	}
}
