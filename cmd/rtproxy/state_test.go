package main

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestBinaryStateListDrop: a route's state outlives the process; `state
// list` shows it, refuses while the proxy holds the directory, and `state
// drop` deletes it.
func TestBinaryStateListDrop(t *testing.T) {
	rulesDir := t.TempDir()
	rule := "route: dedup\nsource: { topic: events, format: json, start: earliest }\nsink: { topic: events.unique }\ncheckpoint_interval: 200ms\n" +
		"steps:\n  - drop_duplicates: { key: value.id }\n"
	os.WriteFile(filepath.Join(rulesDir, "dedup.yaml"), []byte(rule), 0o644)
	p := startRun(t, rulesDir)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.listen), kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 10 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "events", Value: []byte(fmt.Sprintf(`{"id":%d}`, i%4))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second) // the route must start, read and checkpoint: generous for a loaded machine
	for {
		_, body, _ := httpGet(p.admin + "/routes")
		if strings.Contains(body, `"last_checkpoint"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint in /routes after 30s:\n%s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	code, _, errOut := runBinary(t, nil, "state", "list", "--state-dir", p.stateDir)
	if code != 1 || !strings.Contains(errOut, "is in use, probably by a running rtproxy; stop it first") {
		t.Fatalf("state list on a running proxy: exit %d, %q", code, errOut)
	}
	cl.Close()
	p.stop(t)

	// The state directory and everything in it are the owner's only.
	err = filepath.WalkDir(p.stateDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o077 != 0 && path != p.stateDir {
			t.Errorf("%s has mode %v: readable by others", path, fi.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runBinary(t, nil, "state", "list", "--state-dir", p.stateDir)
	if code != 0 || !strings.Contains(out, "ROUTE") {
		t.Fatalf("state list: exit %d, %q %q", code, out, errOut)
	}
	var row []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "dedup" {
			row = f
		}
	}
	if len(row) != 6 || row[1] == "-" || row[5] == "0" {
		t.Fatalf("state list has no checkpointed dedup route with steps:\n%s", out)
	}

	code, out, errOut = runBinary(t, nil, "state", "drop", "dedup", "--state-dir", p.stateDir)
	want := "deleted consumer group rtproxy.dedup and topics dedup.00-drop_duplicates.changelog, dedup.00-drop_duplicates.repartition\n" +
		"dropped the state of route dedup\n"
	if code != 0 || out != want {
		t.Fatalf("state drop: exit %d, %q %q", code, out, errOut)
	}
	// The embedded cluster in the state directory no longer has the
	// route's group or internal topics, and still has its source.
	e, err := startEmbedded(p.stateDir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ecl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...))
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(ecl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !topics.Has("events") || topics.Has("dedup.00-drop_duplicates.changelog") || topics.Has("dedup.00-drop_duplicates.repartition") {
		t.Errorf("topics after the drop: %v", topics.Names())
	}
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(groups.Groups(), "rtproxy.dedup") {
		t.Errorf("group rtproxy.dedup is still there: %v", groups.Groups())
	}
	ecl.Close()
	e.Close()
	code, out, _ = runBinary(t, nil, "state", "list", "--state-dir", p.stateDir)
	if code != 0 || strings.Contains(out, "dedup") {
		t.Fatalf("after drop: exit %d\n%s", code, out)
	}
	code, _, errOut = runBinary(t, nil, "state", "drop", "--state-dir", p.stateDir, "dedup")
	if code != 1 || !strings.Contains(errOut, `no state for route "dedup"`) {
		t.Fatalf("second drop: exit %d, %q", code, errOut)
	}
	code, _, errOut = runBinary(t, nil, "state", "frobnicate")
	if code != 2 || !strings.Contains(errOut, "usage: rtproxy state list") {
		t.Fatalf("bad verb: exit %d, %q", code, errOut)
	}
}
