package jsoncodec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// Strings and numbers from the intern caches are the right values, however
// the slots collide and repeat: many documents over a small alphabet
// against encoding/json.
func TestDecodeInternedValues(t *testing.T) {
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
		got, err := Decode(b.Bytes())
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
func TestDecodeNegativeZero(t *testing.T) {
	for range 3 { // the second and third time through the caches
		v, err := Decode([]byte(`[-0, 0, -0.0, 0.0, 1, 1023.0, 1024]`))
		if err != nil {
			t.Fatal(err)
		}
		a := v.([]any)
		for i, neg := range []bool{true, false, true, false, false, false, false} {
			if math.Signbit(a[i].(float64)) != neg {
				t.Fatalf("element %d = %v: sign bit %v, want %v", i, a[i], !neg, neg)
			}
		}
		if out, _ := Append(nil, v); string(out) != `[-0,0,-0,0,1,1023,1024]` {
			t.Fatalf("re-encoded as %s", out)
		}
	}
}

// An interned string is a copy: the cache never holds on to a record's
// bytes, and only a string seen twice in a row at its slot is admitted.
func TestInternStringOwnsItsBytes(t *testing.T) {
	var c Interner
	buf := string([]byte(`xx"settled"xx`))
	view := buf[3:10]
	if v := c.BoxString(view, true); v.(string) != "settled" || unsafe.StringData(v.(string)) != unsafe.StringData(view) {
		t.Fatalf("first sight: got %q, want the view itself (no copy yet)", v)
	}
	v := c.BoxString(view, true)
	if v.(string) != "settled" || unsafe.StringData(v.(string)) == unsafe.StringData(view) {
		t.Fatalf("second sight: got %q sharing the record's bytes", v)
	}
	again := c.BoxString(buf[3:10], true)
	if unsafe.StringData(again.(string)) != unsafe.StringData(v.(string)) {
		t.Fatal("third sight did not reuse the interned box")
	}
	long := string(bytes.Repeat([]byte("y"), internMaxLen+1))
	c.BoxString(long, true)
	if got := c.BoxString(long, true).(string); unsafe.StringData(got) != unsafe.StringData(long) {
		t.Fatal("a string longer than internMaxLen was copied")
	}
}

// Decoding repeated values allocates less than decoding distinct ones, and
// a pooled decoder starts clean after a failed document.
func TestDecodeReusesBoxes(t *testing.T) {
	if _, err := Decode([]byte(`{"a":[1,2,{"b":"x","c":[3,`)); err == nil {
		t.Fatal("truncated document accepted")
	}
	v, err := Decode([]byte(`{"x":[3,{"y":"z"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := Append(nil, v); string(out) != `{"x":[3,{"y":"z"}]}` {
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
	aSame := testing.AllocsPerRun(200, func() { _, _ = Decode(same) })
	aDistinct := testing.AllocsPerRun(200, func() { _, _ = Decode(docs[k%len(docs)]); k++ })
	// distinct: the input copy, the slice, 5 strings, 3 numbers; same: the
	// input copy and the slice.
	if aSame > 3 || aDistinct < 9 {
		t.Fatalf("allocations per decode: %v with repeated values, %v with distinct ones", aSame, aDistinct)
	}
}
