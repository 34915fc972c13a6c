package jsoncodec

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// The decimal fast path (n / 10^frac) must give exactly ParseFloat's bits.
func TestDecodeNumbersMatchParseFloat(t *testing.T) {
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
		got, err := Decode([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		want, _ := strconv.ParseFloat(s, 64)
		if g, ok := got.(float64); !ok || math.Float64bits(g) != math.Float64bits(want) {
			t.Fatalf("%s decoded to %v (%T), ParseFloat says %v", s, got, got, want)
		}
	}
}
