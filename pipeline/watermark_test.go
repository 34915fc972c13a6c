package pipeline

import (
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/rules"
)

// The watermark rules, step by step: held back until every partition has
// spoken or idled, min over active partitions minus lateness, idle
// partitions ignored, wall-clock advance when all are idle, never back.
func TestWatermarkRules(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var w watermark
	w.init(rules.Source{Watermark: 100 * time.Millisecond, IdleTimeout: time.Second}, 2, t0)

	type step struct {
		what   string
		p      int32 // -1: tick
		ev     int64
		now    int
		want   int64
		moved  bool
		exists bool
	}
	for _, s := range []step{
		{"p0 speaks, p1 silent but not yet idle: no watermark", 0, 5000, 10, 0, false, false},
		{"p1 speaks: min(5000,3000)-100", 1, 3000, 20, 2900, true, true},
		{"p1 moves ahead: min is p0", 1, 9000, 30, 4900, true, true},
		{"an older event on p0 does not lower its max", 0, 100, 40, 4900, false, true},
		{"p1 speaks at 1050ms, p0 idle (>1s since 40ms): p1 alone holds it", 1, 9000, 1050, 8900, true, true},
		{"p1 idle too (>1s since 1050ms): all idle, stands at 8900", -1, 0, 2100, 8900, false, true},
		{"still all idle: wall clock speed from there", -1, 0, 2500, 8900 + 400, true, true},
		{"p0 wakes with an old event: never moves back", 0, 6000, 2600, 8900 + 400, false, true},
	} {
		var got int64
		var moved bool
		if s.p < 0 {
			got, moved = w.tick(at(s.now))
		} else {
			got, moved = w.observe(s.p, s.ev, at(s.now))
		}
		cur, exists := w.current()
		if moved != s.moved || exists != s.exists || (exists && cur != s.want) || (moved && got != s.want) {
			t.Fatalf("%s: got %d moved=%v current=%d exists=%v; want %d moved=%v exists=%v", s.what, got, moved, cur, exists, s.want, s.moved, s.exists)
		}
	}
}

func TestWatermarkSilentPartitionIdlesOut(t *testing.T) {
	t0 := time.Unix(0, 0)
	var w watermark
	w.init(rules.Source{IdleTimeout: 500 * time.Millisecond}, 3, t0)
	if _, moved := w.observe(0, 10_000, t0.Add(100*time.Millisecond)); moved {
		t.Fatal("moved while partitions 1 and 2 could still deliver older records")
	}
	if wm, moved := w.tick(t0.Add(550 * time.Millisecond)); !moved || wm != 10_000 {
		t.Fatalf("after idle_timeout without records the silent partitions must not hold it: got %d moved=%v", wm, moved)
	}
}

// TestWatermarkDormantUntilFirstPartition: before any partition is seen
// the watermark is dormant (the idle loop rests: no tick can move it, even
// past idle_timeout); the first partition seen wakes the idle loop once,
// and from then on it is not dormant (ticks move it with the clock).
func TestWatermarkDormantUntilFirstPartition(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var w watermark
	w.init(rules.Source{IdleTimeout: time.Second}, 2, t0)
	wake := make(chan struct{}, 1)
	w.wake = wake
	for _, d := range []time.Duration{0, 2 * time.Second, time.Hour} {
		if _, moved := w.tick(t0.Add(d)); moved || !w.dormant() {
			t.Fatalf("at +%v: moved %t, dormant %t; want a dormant watermark that does not move", d, moved, w.dormant())
		}
	}
	select {
	case <-wake:
		t.Fatal("woken before any partition was seen")
	default:
	}
	w.observe(1, 5000, t0.Add(time.Hour))
	select {
	case <-wake:
	default:
		t.Fatal("the first partition seen did not wake the idle loop")
	}
	if w.dormant() {
		t.Fatal("dormant after a partition was seen")
	}
	w.observe(1, 6000, t0.Add(time.Hour+time.Second))
	select {
	case <-wake:
		t.Fatal("woken again by a partition already seen")
	default:
	}
	// Every partition idle: the watermark moves with the clock on ticks.
	w.tick(t0.Add(time.Hour + 5*time.Second))
	if _, moved := w.tick(t0.Add(time.Hour + 6*time.Second)); !moved {
		t.Fatal("an idle watermark did not move on a tick")
	}
	if w.dormant() {
		t.Fatal("dormant once it exists")
	}
}
