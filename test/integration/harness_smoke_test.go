package integration

import (
	"testing"
	"time"
)

// TestHarnessKfakeRestart proves the harness itself: kfake on fixed ports
// with a data dir keeps acknowledged records across a kill and restart.
func TestHarnessKfakeRestart(t *testing.T) {
	k := StartKfake(t, KfakeOpts{DataDir: t.TempDir(), Topics: map[string]int{"harness": 3}})
	want := Produce(t, k.Addrs, "harness", "before", 30)
	k.Kill()
	k.Restart()
	want = append(want, Produce(t, k.Addrs, "harness", "after", 30)...)
	got := Consume(t, k.Addrs, "harness", len(want), 20*time.Second)
	AssertSameSet(t, "records after restart", Values(got), want)
}
