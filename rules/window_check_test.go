package rules

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/operators"
)

// TestWindowRefusedLikeTheStep: a sliding window of 10000500ms by 1s puts
// a record in up to 10001 windows (10000.5, rounded up, is what the step
// counts). The step refuses it, so `rtproxy check` must refuse it too,
// instead of passing a rule that dead-letters every record at run time.
func TestWindowRefusedLikeTheStep(t *testing.T) {
	file := base + "steps:\n  - window:\n      kind: sliding\n      size: 10000500ms\n      slide: 1s\n      aggregate: { n: count() }\n"
	got := loadErrors(t, map[string]string{"r.yaml": file})
	want := "r.yaml:10:14: a `size` of 2h46m40.5s sliding by 1s puts every record in 10001 windows, more than 10000; use a larger slide (near `1s`)"
	if strings.Join(got, "\n") != want {
		t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), want)
	}
}

// deadCount counts what a step does with records.
type deadCount struct {
	emitted int
	dead    []string // reason: error
}

func (d *deadCount) Emit(*operators.Record) { d.emitted++ }
func (d *deadCount) DeadLetter(_ *operators.Record, reason operators.Reason, err error) {
	d.dead = append(d.dead, fmt.Sprintf("%s: %v", reason, err))
}

// runtimeRefuses reports whether a window step built from spec refuses
// the records it gets (it dead-letters each with its validation error).
func runtimeRefuses(t *testing.T, step operators.Step, rng *rand.Rand) (bool, string) {
	t.Helper()
	var out deadCount
	const n = 1
	for i := range n {
		step.Process(&operators.Record{Offset: int64(i), Partition: 0, EventTime: rng.Int63n(1 << 40), Value: map[string]any{"a": 1.0}}, &out)
	}
	switch len(out.dead) {
	case 0:
		return false, ""
	case n:
		return true, out.dead[0]
	}
	t.Fatalf("the step dead-lettered %d of %d records: %q", len(out.dead), n, out.dead)
	return false, ""
}

// randomDuration is a window length as a person might write one, or a
// nasty one: whole units, milliseconds, sub-millisecond parts, and lengths
// at the edge of MaxWindowsPerRecord for a given slide.
func randomDuration(rng *rand.Rand, other time.Duration) time.Duration {
	units := []time.Duration{time.Microsecond, time.Millisecond, time.Second, time.Minute, time.Hour}
	switch rng.Intn(6) {
	case 0:
		return time.Duration(1+rng.Intn(90)) * units[1+rng.Intn(4)]
	case 1:
		return time.Duration(1+rng.Int63n(int64(10*time.Second/time.Millisecond))) * time.Millisecond
	case 2:
		return time.Duration(1 + rng.Int63n(int64(3*time.Millisecond)))
	case 3:
		return time.Duration(rng.Int63n(int64(time.Hour)))
	default:
		if other <= 0 {
			other = time.Duration(1+rng.Intn(5000)) * time.Millisecond
		}
		// About MaxWindowsPerRecord times other, give or take a little.
		n := int64(operators.MaxWindowsPerRecord - 2 + rng.Intn(5))
		d := time.Duration(n) * other
		return d + time.Duration(rng.Int63n(int64(2*other+1))) - other + time.Duration(rng.Intn(3)-1)*time.Microsecond
	}
}

// TestWindowCheckAgreesWithRuntime runs random window sizes and slides
// through both paths: the analyzer (LoadFile's loader on a rule file) and
// the window step itself. A rule the analyzer passes must run; a window
// the analyzer refuses for its values must be refused by the step too.
// The one refusal that is the rule file's alone is `slide` written on a
// tumbling window: the step ignores a tumbling window's slide.
func TestWindowCheckAgreesWithRuntime(t *testing.T) {
	rng := rand.New(rand.NewSource(17))
	var accepted, refused int
	cases := 3000
	if testing.Short() {
		cases = 500
	}
	for i := range cases {
		kind := operators.WindowKinds[rng.Intn(2)]
		var size, slide time.Duration
		if rng.Intn(2) == 0 {
			slide = randomDuration(rng, 0)
			size = randomDuration(rng, slide)
		} else {
			size = randomDuration(rng, 0)
			slide = randomDuration(rng, 0)
		}
		writeSlide := kind == "sliding" || rng.Intn(10) == 0
		if kind == "sliding" && rng.Intn(20) == 0 {
			writeSlide = false
		}
		if size <= 0 || (writeSlide && slide <= 0) {
			continue // not a duration a rule file can hold (must be > 0)
		}
		w := fmt.Sprintf("kind: %s, size: %s", kind, size)
		if writeSlide {
			w += fmt.Sprintf(", slide: %s", slide)
		} else {
			slide = 0
		}
		src := base + "steps:\n  - window: { " + w + ", aggregate: { n: count() } }\n"
		res := loadBytes("r.yaml", []byte(src), Options{})
		checkOK := len(res.errs) == 0

		spec := operators.WindowSpec{Kind: kind, Size: size, Slide: slide, Aggregates: []operators.Aggregate{{Name: "n", Func: operators.AggCount}}}
		runRefuses, why := runtimeRefuses(t, operators.NewWindow(spec), rng)

		switch {
		case checkOK:
			accepted++
			if runRefuses {
				t.Errorf("case %d: %s passes the check, but the step refuses every record: %s", i, w, why)
			}
			built, err := res.route.Steps[0].Build(BuildEnv{})
			if err != nil {
				t.Fatalf("case %d: %s: build: %v", i, w, err)
			}
			if refuses, why := runtimeRefuses(t, built, rng); refuses {
				t.Errorf("case %d: %s passes the check, but the built step refuses every record: %s", i, w, why)
			}
		default:
			refused++
			for _, e := range res.errs {
				if e.Line < 7 || e.Col < 1 {
					t.Errorf("case %d: %s: error not located in the window step: %v", i, w, e)
				}
			}
			if kind == "tumbling" && writeSlide {
				continue // slide on a tumbling window: the rule file's own refusal
			}
			if !runRefuses {
				t.Errorf("case %d: %s is refused by the check, but the step runs it: %v", i, w, res.errs.asError())
			}
		}
	}
	if accepted < cases/10 || refused < cases/10 {
		t.Fatalf("weak cases: %d accepted, %d refused", accepted, refused)
	}
	t.Logf("%d accepted, %d refused", accepted, refused)
}
