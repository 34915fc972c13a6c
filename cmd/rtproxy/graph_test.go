package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestBinaryCheckRouteGraph is findings 1 and 2 through `rtproxy check`:
// two route files in one group, and a loop between two files, exit 1
// with positioned errors naming the other file.
func TestBinaryCheckRouteGraph(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a.yaml": "route: a\nsource: { topic: pay, group: shared }\nsink: { topic: pay.a }\n",
		"b.yaml": "route: b\nsource: { topic: pay, group: shared }\nsink: { topic: pay.b }\n",
		"x.yaml": "route: x\nsource: { topic: loop.x }\nsink: { topic: loop.y }\nsteps:\n  - explode: { each: value.items, as: item }\n",
		"y.yaml": "route: y\nsource: { topic: loop.y }\nsink: { topic: loop.x }\n",
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := runBinary(t, nil, "check", dir)
	if code != 1 {
		t.Fatalf("check accepted a shared group and a loop: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		filepath.Join(dir, "b.yaml") + ":2:30: consumer group `shared` (source.group) is also the group of route `a` (its source.group at " + filepath.Join(dir, "a.yaml") + ":2:30)",
		filepath.Join(dir, "y.yaml") + ":3:16: the routes form a cycle: `loop.y` → route `y`",
		"route `x` (" + filepath.Join(dir, "x.yaml") + ":3:16) writes `loop.y`, the source of this route",
		"ok " + filepath.Join(dir, "a.yaml"), "ok " + filepath.Join(dir, "x.yaml"),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
}

// TestBinarySharedGroupRefused is findings 1 and 2 at run time: with two
// route files in one group, the second is refused (its error on /routes
// names the first) and the first reads every record of the source, none
// lost to a group split; of two files that form a loop, the second is
// refused and a record produced into the loop does not come back.
func TestBinarySharedGroupRefused(t *testing.T) {
	rulesDir := t.TempDir()
	os.WriteFile(filepath.Join(rulesDir, "a.yaml"), []byte("route: a\nsource: { topic: split, group: shared, start: earliest }\nsink: { topic: split.a }\n"), 0o644)
	os.WriteFile(filepath.Join(rulesDir, "b.yaml"), []byte("route: b\nsource: { topic: split, group: shared, start: earliest }\nsink: { topic: split.b }\n"), 0o644)
	// Finding 2 beside it: a loop between two files, one of them exploding.
	os.WriteFile(filepath.Join(rulesDir, "x.yaml"), []byte("route: x\nsource: { topic: loop.x, start: earliest }\nsink: { topic: loop.y }\nsteps:\n  - explode: { each: value.items, as: item }\n"), 0o644)
	os.WriteFile(filepath.Join(rulesDir, "y.yaml"), []byte("route: y\nsource: { topic: loop.y, start: earliest }\nsink: { topic: loop.x }\n"), 0o644)
	p := startRun(t, rulesDir)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.listen), kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeTopics("split.a"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = "split", 3, 1
	req.Topics = append(req.Topics, rt)
	if _, err := req.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	const n = 90
	for i := range n {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "split", Key: []byte(fmt.Sprint(i)), Value: []byte(fmt.Sprintf(`{"i":%d}`, i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]bool{}
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("split.a holds %d of %d records: the group split the source", len(got), n)
		}
		fs.EachRecord(func(r *kgo.Record) { got[string(r.Value)] = true })
	}
	_, body, err := httpGet(p.admin + "/routes")
	if err != nil {
		t.Fatal(err)
	}
	want := "consumer group `shared` (source.group) is also the group of route `a` (its source.group at " + filepath.Join(rulesDir, "a.yaml") + ":2:32)"
	if !strings.Contains(body, want) {
		t.Errorf("/routes does not show b.yaml refused (%q):\n%s", want, body)
	}
	if !strings.Contains(p.Logs(), "rule file refused") {
		t.Error("the refusal is not logged")
	}
	if want := filepath.Join(rulesDir, "y.yaml") + ":3:16: the routes form a cycle"; !strings.Contains(body, want) {
		t.Errorf("/routes does not show y.yaml refused for the loop (%q):\n%s", want, body)
	}
	// One record into the loop: x explodes it into loop.y, and nothing
	// comes back to loop.x.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "loop.x", Value: []byte(`{"items":[1,2,3]}`)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	count := func(topic string, want int, settle time.Duration) int {
		c, err := kgo.NewClient(kgo.SeedBrokers(p.listen), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		n := 0
		deadline := time.Now().Add(30 * time.Second)
		quietUntil := time.Time{}
		for time.Now().Before(deadline) {
			pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
			fs := c.PollFetches(pctx)
			pcancel()
			fs.EachRecord(func(*kgo.Record) { n++ })
			if n >= want && quietUntil.IsZero() {
				quietUntil = time.Now().Add(settle)
			}
			if !quietUntil.IsZero() && time.Now().After(quietUntil) {
				break
			}
		}
		return n
	}
	if n := count("loop.y", 3, time.Second); n != 3 {
		t.Errorf("loop.y holds %d records, want the 3 x exploded", n)
	}
	if n := count("loop.x", 1, 2*time.Second); n != 1 {
		t.Errorf("loop.x holds %d records, want the 1 produced: the loop ran", n)
	}
	cl.Close()
	p.stop(t)
}
