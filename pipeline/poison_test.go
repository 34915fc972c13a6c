package pipeline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
	"github.com/rtproxy/rtproxy/state"
)

// createTopic creates topic with configs (topic-level overrides).
func createTopic(t *testing.T, b *broker, topic string, parts int32, configs map[string]string) {
	t.Helper()
	cfg := map[string]*string{}
	for k, v := range configs {
		cfg[k] = &v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(b.client(t)).CreateTopic(ctx, parts, -1, cfg, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create %s: %v", topic, err)
	}
}

// An output the brokers refuse for itself (larger than the sink topic's
// max.message.bytes) is a poison: retrying it never succeeds. It goes to
// the dead-letter topic with reason "sink" and the topic it was meant for,
// the route goes on, and its checkpoints pass it (issue 10). A dead letter
// refused in turn is written without its value.
func TestPoisonOutputGoesToDeadLetters(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dlqLimit bool // the dead-letter topic refuses the big record too
		eo       bool // sink.delivery exactly_once: the dead letter is in the transaction
	}{{"dead letter with the value", false, false}, {"dead letter without the value", true, false},
		{"exactly once", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			b := startBroker(t, map[string]int{"po": 1})
			createTopic(t, b, "po.out", 1, map[string]string{"max.message.bytes": "2000"})
			if tc.dlqLimit {
				createTopic(t, b, "po.dlq", 1, map[string]string{"max.message.bytes": "2000"})
			}
			var rs []*kgo.Record
			for i := 0; i < 10; i++ {
				v := map[string]any{"n": i}
				if i == 5 {
					// Random, so that no producer compression shrinks it.
					pad := make([]byte, 2000)
					rand.Read(pad)
					v["pad"] = hex.EncodeToString(pad)
				}
				rs = append(rs, jsonRecord("po", fmt.Sprint(i), v))
			}
			b.produce(t, rs...)
			dir := t.TempDir()
			reg := prometheus.NewRegistry()
			def := newRouteDef("po", "v1", "po", "po.out")
			consume := b.consume
			if tc.eo {
				def.Sink.Delivery = rules.DeliveryExactlyOnce
				consume = b.consumeCommitted
			}
			m, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: dir, Registerer: reg}, def)

			out := consume(t, "po.out", 9, 20*time.Second, 300*time.Millisecond)
			if len(out) != 9 {
				t.Fatalf("sink holds %d records, want the 9 that fit", len(out))
			}
			dl := consume(t, "po.dlq", 1, 20*time.Second, 300*time.Millisecond)
			if len(dl) != 1 {
				t.Fatalf("dead-letter topic holds %d records, want 1", len(dl))
			}
			d := dl[0]
			if got := header(d, HeaderReason); got != "sink" {
				t.Errorf("reason %q, want sink", got)
			}
			if got := header(d, HeaderTarget); got != "po.out" {
				t.Errorf("target %q, want po.out", got)
			}
			if got, want := header(d, HeaderSource), srcRef(rs[5]); got != want {
				t.Errorf("source %q, want %q", got, want)
			}
			if e := header(d, HeaderError); !strings.Contains(e, "MESSAGE_TOO_LARGE") {
				t.Errorf("error header %q does not name the broker's refusal", e)
			}
			if tc.dlqLimit {
				if d.Value != nil || !strings.Contains(header(d, HeaderError), "written without its") {
					t.Errorf("bare dead letter: value %d bytes, error %q", len(d.Value), header(d, HeaderError))
				}
			} else if string(d.Value) != string(rs[5].Value) {
				t.Errorf("dead letter value differs from the refused output (%d vs %d bytes)", len(d.Value), len(rs[5].Value))
			}
			if n := gathered(t, reg, "rtproxy_pipeline_dead_letters_total"); n != 1 {
				t.Errorf("rtproxy_pipeline_dead_letters_total = %v, want 1", n)
			}
			// The route goes on, and its checkpoint passes the poison.
			b.produce(t, jsonRecord("po", "10", map[string]any{"n": 10}))
			consume(t, "po.out", 10, 20*time.Second, 0)
			waitFor(t, 20*time.Second, "a checkpoint past the poison", func() bool {
				st := m.Routes()
				return len(st) == 1 && len(st[0].Partitions) == 1 && st[0].Partitions[0].DoneOffset == 11 && st[0].LastCheckpoint != nil
			})
			stop()
			db, err := state.Open(dir, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			cp, ok, err := db.LoadCheckpoint("po")
			if err != nil || !ok || cp.Offsets[0] != 11 {
				t.Fatalf("final checkpoint %+v (ok %v, err %v), want offset 11", cp, ok, err)
			}
		})
	}
}

// A stop (SIGTERM) never commits past an output that failed: the route's
// context ends before its final checkpoint, and an output whose write
// fails after that is given up, not counted as acknowledged. The final
// checkpoint, local and in the group, stays before it, so the next run
// writes it (issue 10).
func TestStopNeverCommitsPastFailedOutputs(t *testing.T) {
	b := startBroker(t, map[string]int{"ab": 1, "ab.out": 1}, "-auto-create=false")
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	m, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: dir, Registerer: reg, StopTimeout: 45 * time.Second},
		newRouteDef("ab", "v1", "ab", "ab.out"))
	for i := 0; i < 10; i++ {
		b.produce(t, jsonRecord("ab", fmt.Sprint(i), map[string]any{"n": i}))
	}
	b.consume(t, "ab.out", 10, 20*time.Second, 0)
	var doneAt time.Time
	waitFor(t, 20*time.Second, "offset 10 done", func() bool {
		st := m.Routes()
		doneAt = time.Now()
		return len(st) == 1 && len(st[0].Partitions) == 1 && st[0].Partitions[0].DoneOffset == 10
	})
	waitFor(t, 20*time.Second, "a checkpoint at offset 10", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].LastCheckpoint != nil && st[0].LastCheckpoint.After(doneAt)
	})

	// The sink disappears (and is not auto-created): outputs fail and are
	// retried.
	adm := kadm.NewClient(b.client(t))
	if _, err := adm.DeleteTopics(context.Background(), "ab.out"); err != nil {
		t.Fatal(err)
	}
	for i := 10; i < 20; i++ {
		b.produce(t, jsonRecord("ab", fmt.Sprint(i), map[string]any{"n": i}))
	}
	waitFor(t, 40*time.Second, "failed sink writes", func() bool {
		return gathered(t, reg, "rtproxy_pipeline_sink_errors_total") > 0
	})
	stop() // SIGTERM: Run returns once the route gave up its outputs
	db, err := state.Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if cp, ok, err := db.LoadCheckpoint("ab"); err != nil || !ok || cp.Offsets[0] != 10 {
		t.Errorf("local checkpoint %+v (ok %v, err %v), want offset 10: the outputs of 10..19 never reached the sink", cp, ok, err)
	}
	offs, err := adm.FetchOffsets(context.Background(), "rtproxy.ab")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup("ab", 0); !ok || o.At != 10 {
		t.Errorf("group commit %+v (ok %v), want offset 10: the outputs of 10..19 never reached the sink", o, ok)
	}
}

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}

// A sink topic that the route created and that is deleted while the route
// runs is recreated, and the records written meanwhile reach it (issue 10).
func TestDeletedSinkIsRecreated(t *testing.T) {
	b := startBroker(t, map[string]int{"rc": 2}, "-auto-create=false")
	_, _ = runManager(t, b, t.TempDir(), newRouteDef("rc", "v1", "rc", "rc.out"))
	for i := 0; i < 10; i++ {
		b.produce(t, jsonRecord("rc", fmt.Sprint(i), map[string]any{"n": i}))
	}
	b.consume(t, "rc.out", 10, 20*time.Second, 0)
	adm := kadm.NewClient(b.client(t))
	if _, err := adm.DeleteTopics(context.Background(), "rc.out"); err != nil {
		t.Fatal(err)
	}
	var later []*kgo.Record
	for i := 10; i < 20; i++ {
		r := jsonRecord("rc", fmt.Sprint(i), map[string]any{"n": i})
		later = append(later, r)
		b.produce(t, r)
	}
	out := b.consume(t, "rc.out", 10, 60*time.Second, 500*time.Millisecond)
	seen := map[string]int{}
	for _, r := range out {
		seen[header(r, HeaderSource)]++
	}
	for _, r := range later {
		if seen[srcRef(r)] != 1 {
			t.Errorf("%s is in the recreated sink %d times, want once", srcRef(r), seen[srcRef(r)])
		}
	}
	if len(out) != 10 {
		t.Errorf("the recreated sink holds %d records, want the 10 written after the delete", len(out))
	}
}

// A sink the route created stays its own across a reload: the next
// version recreates it when it is deleted (the soak found it left to wait
// for someone else, because only the version that created it knew).
func TestDeletedSinkIsRecreatedAfterReload(t *testing.T) {
	b := startBroker(t, map[string]int{"rr": 2}, "-auto-create=false")
	m, _ := runManager(t, b, t.TempDir(), newRouteDef("rr", "v1", "rr", "rr.out"))
	b.produce(t, jsonRecord("rr", "0", map[string]any{"n": 0}))
	b.consume(t, "rr.out", 1, 20*time.Second, 0)
	m.Apply([]*rules.Route{newRouteDef("rr", "v2", "rr", "rr.out")})
	waitFor(t, 20*time.Second, "v2 running", func() bool {
		m.mu.Lock()
		r := m.mu.routes["rr"]
		m.mu.Unlock()
		st := m.Routes()
		return r != nil && r.def.Hash == "v2" && len(st) == 1 && st[0].State == "running"
	})
	if _, err := kadm.NewClient(b.client(t)).DeleteTopics(context.Background(), "rr.out"); err != nil {
		t.Fatal(err)
	}
	r := jsonRecord("rr", "1", map[string]any{"n": 1})
	b.produce(t, r)
	out := b.consume(t, "rr.out", 1, 30*time.Second, 500*time.Millisecond)
	if len(out) != 1 || header(out[0], HeaderSource) != srcRef(r) {
		t.Errorf("the recreated sink holds %d records, want the one written after the delete", len(out))
	}
}

// A checkpoint that cannot commit (here: the changelog refuses its
// records) is retried before the next cut is taken: at most one cut, with
// its copies of the state, waits in memory (issue 10).
func TestFailedCommitKeepsOnePendingCut(t *testing.T) {
	b := startBroker(t, map[string]int{"pc": 1})
	createTopic(t, b, "pc.00-drop_duplicates.changelog", 1, map[string]string{"max.message.bytes": "600", "cleanup.policy": "compact"})
	m, _ := runManager(t, b, t.TempDir(), newRouteDef("pc", "v1", "pc", "pc.out", dedupStep(t, 0, "value.txn")))
	for i := 0; i < 20; i++ {
		pad := make([]byte, 600)
		rand.Read(pad)
		b.produce(t, jsonRecord("pc", fmt.Sprint(i), map[string]any{"txn": hex.EncodeToString(pad)}))
	}
	b.consume(t, "pc.out", 20, 20*time.Second, 0)
	waitFor(t, 20*time.Second, "failed checkpoints reported", func() bool {
		st := m.Routes()
		return len(st) == 1 && strings.Contains(st[0].LastError, "checkpoint")
	})
	time.Sleep(2 * time.Second) // ten checkpoint intervals
	m.mu.Lock()
	r := m.mu.routes["pc"]
	m.mu.Unlock()
	r.cp.mu.Lock()
	n := len(r.cp.pending)
	r.cp.mu.Unlock()
	if n > 1 {
		t.Errorf("%d cuts wait to commit after ten failed checkpoints, want at most 1", n)
	}
}

// A topic table written transactionally ends in a commit marker, which a
// consumer never sees as a record: the catch-up must still reach the end
// (it waited forever), and records of an aborted transaction are not rows
// (issue 10).
func TestTopicTableEndingInTransactionMarker(t *testing.T) {
	b := startBroker(t, map[string]int{"tx": 1, "txt": 1})
	txn := b.client(t, kgo.TransactionalID("rtproxy-test-table"))
	ctx := context.Background()
	write := func(commit bool, rows ...string) {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			k, v, _ := strings.Cut(r, "=")
			if err := txn.ProduceSync(ctx, &kgo.Record{Topic: "txt", Key: []byte(k), Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	write(true, `m1={"name":"one"}`)
	write(false, `m2={"name":"aborted"}`)
	write(true, `m3={"name":"three"}`)

	def := newRouteDef("tx", "v1", "tx", "tx.out", joinStep(t, 0, "shops", "value.m", "shop", operators.MissingDeadLetter),
		setStep(t, 1, [][2]string{{"name", "shop.name"}}, "shop"))
	def.Tables = map[string]rules.TableSpec{"shops": {Name: "shops", Topic: "txt"}}
	_, _ = runManager(t, b, t.TempDir(), def)
	for _, m := range []string{"m1", "m2", "m3"} {
		b.produce(t, jsonRecord("tx", m, map[string]any{"m": m}))
	}
	out := b.consume(t, "tx.out", 2, 30*time.Second, 300*time.Millisecond)
	names := map[string]bool{}
	for _, r := range out {
		names[string(r.Value)] = true
	}
	if len(out) != 2 || !names[`{"m":"m1","name":"one"}`] || !names[`{"m":"m3","name":"three"}`] {
		var got []string
		for _, r := range out {
			got = append(got, string(r.Value))
		}
		t.Fatalf("sink %v, want m1 and m3 joined (m2's row was aborted)", got)
	}
	dl := b.consume(t, "tx.dlq", 1, 20*time.Second, 0)
	if len(dl) != 1 || header(dl[0], HeaderReason) != "missing" {
		t.Fatalf("dead letters %d, want m2 as missing", len(dl))
	}
}

// A dead letter that the dead-letter topic refuses (a record that is not
// JSON, larger than the topic's limit) is written once more without its
// value; it keeps its own reason (issue 10).
func TestRefusedDeadLetterKeepsItsReason(t *testing.T) {
	b := startBroker(t, map[string]int{"rd": 1})
	createTopic(t, b, "rd.dlq", 1, map[string]string{"max.message.bytes": "2000"})
	runManager(t, b, t.TempDir(), newRouteDef("rd", "v1", "rd", "rd.out"))
	pad := make([]byte, 2000)
	rand.Read(pad)
	bad := &kgo.Record{Topic: "rd", Key: []byte("bad"), Value: []byte("not json " + hex.EncodeToString(pad))}
	b.produce(t, bad, jsonRecord("rd", "good", map[string]any{"n": 1}))
	b.consume(t, "rd.out", 1, 20*time.Second, 0)
	dl := b.consume(t, "rd.dlq", 1, 20*time.Second, 300*time.Millisecond)
	if len(dl) != 1 {
		t.Fatalf("dead-letter topic holds %d records, want 1", len(dl))
	}
	d := dl[0]
	if header(d, HeaderReason) != "decode" || header(d, HeaderSource) != srcRef(bad) || d.Value != nil ||
		!strings.Contains(header(d, HeaderError), "written without its") {
		t.Errorf("dead letter: reason %q, source %q, %d value bytes, error %q; want decode, %s, no value, and why",
			header(d, HeaderReason), header(d, HeaderSource), len(d.Value), header(d, HeaderError), srcRef(bad))
	}
}

// TestTableCatchUpOutlivesSetupDeadline: a topic table's catch-up has no
// setup deadline. Here it must wait past a transaction left open on the
// table topic for three times the setup timeout; the route starts once it
// ends, in its first setup, never failing it and retrying (issue 10).
func TestTableCatchUpOutlivesSetupDeadline(t *testing.T) {
	b := startBroker(t, map[string]int{"tc": 1, "tct": 1})
	txn := b.client(t, kgo.TransactionalID("rtproxy-test-catchup"))
	ctx := context.Background()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := txn.ProduceSync(ctx, &kgo.Record{Topic: "tct", Key: []byte("m1"), Value: []byte(`{"name":"one"}`)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	def := newRouteDef("tc", "v1", "tc", "tc.out", joinStep(t, 0, "shops", "value.m", "shop", operators.MissingDeadLetter),
		setStep(t, 1, [][2]string{{"name", "shop.name"}}, "shop"))
	def.Tables = map[string]rules.TableSpec{"shops": {Name: "shops", Topic: "tct"}}
	const setup = time.Second
	m, _ := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), SetupTimeout: setup}, def)
	b.produce(t, jsonRecord("tc", "m1", map[string]any{"m": "m1"}))
	waitFor(t, 10*time.Second, "the route starting", func() bool {
		st := m.Routes()
		return len(st) == 1 && st[0].State == "starting"
	})
	m.mu.Lock()
	r := m.mu.routes["tc"]
	m.mu.Unlock()
	held := time.Now()
	for time.Since(held) < 3*setup {
		if st := m.Routes(); len(st) != 1 || st[0].State != "starting" {
			t.Fatalf("while the table waits for the open transaction: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	out := b.consume(t, "tc.out", 1, 30*time.Second, 0)
	if string(out[0].Value) != `{"m":"m1","name":"one"}` {
		t.Errorf("sink %s, want m1 joined with the row committed late", out[0].Value)
	}
	if n := r.life.setupAttempts.Load(); n != 1 {
		t.Errorf("%d setup attempts, want 1: the catch-up ran into the setup deadline", n)
	}
}
