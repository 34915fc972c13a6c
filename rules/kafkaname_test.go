package rules

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// The regexps kafkaName replaces: the reference it is checked against.
var (
	refRouteName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)
	refTopicName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)
)

func checkKafkaName(t *testing.T, s string) {
	t.Helper()
	if got, want := routeNameRe.MatchString(s), refRouteName.MatchString(s); got != want {
		t.Errorf("route name %q (%d bytes): %v, the regexp says %v", s, len(s), got, want)
	}
	if got, want := topicNameRe.MatchString(s), refTopicName.MatchString(s); got != want {
		t.Errorf("topic name %q (%d bytes): %v, the regexp says %v", s, len(s), got, want)
	}
}

// TestKafkaNameMatchesTheRegexp: route and topic names are accepted and
// refused exactly as by the regexps they were, at every length around the
// bounds, for every byte, and for random names drawn from the class and a
// few bytes outside it.
func TestKafkaNameMatchesTheRegexp(t *testing.T) {
	for _, n := range []int{0, 1, 2, 199, 200, 201, 248, 249, 250, 400} {
		checkKafkaName(t, strings.Repeat("a", n))
		checkKafkaName(t, strings.Repeat("a", n)+"\n")
		checkKafkaName(t, "\n"+strings.Repeat("a", n))
		checkKafkaName(t, strings.Repeat("é", n))
	}
	for b := 0; b < 256; b++ {
		checkKafkaName(t, string([]byte{byte(b)}))
		checkKafkaName(t, "a"+string([]byte{byte(b)})+"z")
	}
	const alphabet = "azAZ09._-/ é\x00\n$^"
	rng := rand.New(rand.NewPCG(29, 99))
	for i := 0; i < 20000; i++ {
		n := rng.IntN(260)
		var b strings.Builder
		for j := 0; j < n; j++ {
			if rng.IntN(50) == 0 {
				b.WriteByte(alphabet[rng.IntN(len(alphabet))])
			} else {
				b.WriteByte(alphabet[rng.IntN(9)])
			}
		}
		checkKafkaName(t, b.String())
	}
}

// FuzzKafkaName: any input is judged as the regexps judge it.
func FuzzKafkaName(f *testing.F) {
	for _, s := range []string{"", "a", "orders.v1", "a b", "é", strings.Repeat("x", 200), strings.Repeat("x", 249), "x\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkKafkaName(t, s) })
}
