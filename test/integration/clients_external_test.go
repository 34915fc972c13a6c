package integration

// Client cases for clients that are not Go: kcat, kafka-python,
// confluent-kafka (librdkafka) and kafkajs. Each runs a script from
// clients/ (or the kcat binary) through the proxy and asserts on the
// records, their count, and the broker addresses the client saw.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// runClient runs an external client with a timeout and returns its stdout,
// failing the test with stdout+stderr if it exits non-zero.
func runClient(t *testing.T, stdin string, timeout time.Duration, name string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = filepath.Join(ModuleRoot(t), "test", "integration")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s %s: %v", name, args[0], time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.Bytes()
}

// runJSONClient runs a script that prints one JSON object and decodes it.
func runJSONClient(t *testing.T, out any, timeout time.Duration, name string, args ...string) {
	t.Helper()
	b := runClient(t, "", timeout, name, args...)
	// The JSON result is the last non-empty line; libraries may log above it.
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	last := lines[len(lines)-1]
	if err := json.Unmarshal([]byte(last), out); err != nil {
		t.Fatalf("%s: result is not JSON (%v):\n%s", name, err, b)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func expectedValues(prefix string, n int) []string {
	vs := make([]string, n)
	for i := range vs {
		vs[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return vs
}

var kcatBrokerLine = regexp.MustCompile(`(?m)^\s*broker (-?\d+) at (\S+)`)

func TestKcat(t *testing.T) {
	RequireTool(t, "kcat")
	const topic, n = "kcat-topic", 40
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})
	b := s.Bootstrap[0]

	// -L: every broker line must name a proxy listener.
	md := string(runClient(t, "", 20*time.Second, "kcat", "-L", "-b", b, "-t", topic))
	var seen []string
	for _, m := range kcatBrokerLine.FindAllStringSubmatch(md, -1) {
		seen = append(seen, m[2])
	}
	if len(seen) != 3 {
		t.Fatalf("kcat -L listed %d brokers, want 3:\n%s", len(seen), md)
	}
	s.AssertOnlyProxyAddrs(t, seen)
	if !strings.Contains(md, `topic "`+topic+`" with 3 partitions`) {
		t.Errorf("kcat -L does not show %s with 3 partitions:\n%s", topic, md)
	}

	// Produce with kcat; check with franz-go what reached the broker.
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, "k-%d:kcat-%d\n", i, i)
	}
	runClient(t, in.String(), 30*time.Second, "kcat", "-P", "-b", b, "-t", topic, "-K:", "-X", "acks=all")
	got := Consume(t, s.Kfake.Addrs, topic, n, 20*time.Second)
	AssertSameSet(t, "kcat-produced records at the broker", Values(got), expectedValues("kcat", n))
	for _, r := range got {
		if strings.TrimPrefix(string(r.Key), "k-") != strings.TrimPrefix(string(r.Value), "kcat-") {
			t.Errorf("key %q does not match value %q", r.Key, r.Value)
		}
	}

	// Consume with kcat: everything, exiting at the end of each partition.
	out := string(runClient(t, "", 30*time.Second, "kcat", "-C", "-b", b, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k=%s\n"))
	var pairs []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" {
			pairs = append(pairs, l)
		}
	}
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("k-%d=kcat-%d", i, i))
	}
	AssertSameSet(t, "kcat-consumed key=value pairs", pairs, want)
	s.AssertProxyCarried(t, kmsg.Metadata, kmsg.Produce, kmsg.Fetch, kmsg.ListOffsets)
}

type scriptRecord struct {
	Key       string `json:"key"`
	Value     string `json:"value"`
	Partition int32  `json:"partition"`
	Offset    any    `json:"offset"` // kafkajs reports offsets as strings
}

func recordValues(rs []scriptRecord) []string {
	vs := make([]string, len(rs))
	for i, r := range rs {
		vs[i] = r.Value
	}
	return vs
}

// committedOffsets reads a group's committed offsets at the broker.
func committedOffsets(t *testing.T, brokers []string, group, topic string) map[int32]int64 {
	t.Helper()
	adm := kadm.NewClient(NewClient(t, brokers))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	os, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets of %s: %v", group, err)
	}
	out := map[int32]int64{}
	os.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil {
			out[o.Partition] = o.At
		}
	})
	return out
}

func sumOffsets(m map[int32]int64) int64 {
	var s int64
	for _, v := range m {
		s += v
	}
	return s
}

func TestKafkaPythonGroupConsume(t *testing.T) {
	RequireTool(t, "python3-kafka")
	const topic, group, n = "kp-topic", "kp-group", 60
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})
	want := Produce(t, s.Kfake.Addrs, topic, "kp", n)

	var res struct {
		Records     []scriptRecord `json:"records"`
		Brokers     []string       `json:"brokers"`
		Coordinator string         `json:"coordinator"`
		Committed   map[string]int `json:"committed"`
	}
	runJSONClient(t, &res, 90*time.Second, DebianPython, "clients/kafka_python_group.py",
		mustJSON(map[string]any{"bootstrap": s.Bootstrap[0], "topic": topic, "group": group, "want": n, "timeout": 45}))

	AssertSameSet(t, "kafka-python group records", recordValues(res.Records), want)
	if res.Coordinator == "" {
		t.Errorf("kafka-python reported no group coordinator")
	}
	s.AssertOnlyProxyAddrs(t, append(res.Brokers, res.Coordinator))
	// The commit went through the proxy to the broker: the group's offsets
	// there must cover every record.
	if got := sumOffsets(committedOffsets(t, s.Kfake.Addrs, group, topic)); got != n {
		t.Errorf("group %s committed offsets sum to %d at the broker, want %d (script saw %v)", group, got, n, res.Committed)
	}
	s.AssertProxyCarried(t, kmsg.FindCoordinator, kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Fetch, kmsg.OffsetCommit, kmsg.OffsetFetch)
}

type confluentResult struct {
	Delivered []string `json:"delivered"`
	Errors    []string `json:"errors"`
	Brokers   []string `json:"brokers"`
}

func TestConfluentIdempotentProduce(t *testing.T) {
	RequireTool(t, "python3-confluent-kafka")
	const topic, n = "cf-idem", 80
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})

	var res confluentResult
	runJSONClient(t, &res, 60*time.Second, DebianPython, "clients/confluent_produce.py", "idempotent",
		mustJSON(map[string]any{"bootstrap": s.Bootstrap[0], "topic": topic, "n": n}))
	if len(res.Errors) > 0 {
		t.Fatalf("confluent-kafka delivery errors: %v", res.Errors)
	}
	want := expectedValues("idem", n)
	AssertSameSet(t, "confluent-kafka delivery reports", res.Delivered, want)
	s.AssertOnlyProxyAddrs(t, res.Brokers)

	// Exactly n at the broker: idempotence must not have produced duplicates.
	got := ConsumeQuiet(t, s.Kfake.Addrs, topic, n, time.Second, 20*time.Second)
	AssertSameSet(t, "idempotently produced records at the broker", Values(got), want)
	for _, r := range got {
		if r.ProducerID < 0 {
			t.Errorf("record %q has no producer id (%d): not produced idempotently", r.Value, r.ProducerID)
			break
		}
	}
	s.AssertProxyCarried(t, kmsg.InitProducerID, kmsg.Produce)
}

func TestConfluentTransactions(t *testing.T) {
	RequireTool(t, "python3-confluent-kafka")
	const topic, n = "cf-txn", 30
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})

	var res confluentResult
	runJSONClient(t, &res, 90*time.Second, DebianPython, "clients/confluent_produce.py", "transactions",
		mustJSON(map[string]any{"bootstrap": s.Bootstrap[0], "topic": topic, "n": n, "txn_id": "cf-txn-1"}))
	if len(res.Errors) > 0 {
		t.Fatalf("confluent-kafka transaction errors: %v", res.Errors)
	}
	committed, aborted := expectedValues("committed", n), expectedValues("aborted", n)
	AssertSameSet(t, "confluent-kafka delivery reports (both transactions)", res.Delivered, append(append([]string{}, committed...), aborted...))
	s.AssertOnlyProxyAddrs(t, res.Brokers)

	// read_committed sees exactly the committed transaction...
	rc := ConsumeQuiet(t, s.Bootstrap, topic, n, 1500*time.Millisecond, 20*time.Second,
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	AssertSameSet(t, "read_committed records", Values(rc), committed)
	// ...while read_uncommitted proves the aborted records did reach the log.
	ru := ConsumeQuiet(t, s.Bootstrap, topic, 2*n, 1500*time.Millisecond, 20*time.Second)
	AssertSameSet(t, "read_uncommitted records", Values(ru), append(append([]string{}, committed...), aborted...))
	s.AssertProxyCarried(t, kmsg.FindCoordinator, kmsg.InitProducerID, kmsg.AddPartitionsToTxn, kmsg.Produce, kmsg.EndTxn)

	// And librdkafka's own consumers agree, for both isolation levels.
	for _, iso := range []struct {
		level string
		want  []string
	}{
		{"read_committed", committed},
		{"read_uncommitted", append(append([]string{}, committed...), aborted...)},
	} {
		var cres struct {
			Values  []string `json:"values"`
			Errors  []string `json:"errors"`
			Brokers []string `json:"brokers"`
		}
		runJSONClient(t, &cres, 60*time.Second, DebianPython, "clients/confluent_consume.py",
			mustJSON(map[string]any{"bootstrap": s.Bootstrap[0], "topic": topic, "group": "cf-" + iso.level, "isolation": iso.level, "timeout": 30}))
		if len(cres.Errors) > 0 {
			t.Errorf("confluent-kafka %s consumer errors: %v", iso.level, cres.Errors)
		}
		AssertSameSet(t, "confluent-kafka "+iso.level+" records", cres.Values, iso.want)
		s.AssertOnlyProxyAddrs(t, cres.Brokers)
	}
}

func TestKafkajsGzipGroupConsume(t *testing.T) {
	RequireTool(t, "kafkajs")
	const topic, group, n = "kjs-topic", "kjs-group", 50
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})

	var res struct {
		Produced  []string         `json:"produced"`
		Records   []scriptRecord   `json:"records"`
		Brokers   []string         `json:"brokers"`
		Committed map[string]int64 `json:"committed"`
	}
	runJSONClient(t, &res, 90*time.Second, "node", "clients/kafkajs_gzip_group.js",
		mustJSON(map[string]any{"bootstrap": s.Bootstrap[0], "topic": topic, "group": group, "n": n, "timeout": 45}))
	want := expectedValues("gzip", n)
	AssertSameSet(t, "kafkajs produced", res.Produced, want)
	AssertSameSet(t, "kafkajs group-consumed", recordValues(res.Records), want)
	s.AssertOnlyProxyAddrs(t, res.Brokers)

	// At the broker the batches must really be gzip (codec 1), with the same content.
	got := Consume(t, s.Kfake.Addrs, topic, n, 20*time.Second)
	AssertSameSet(t, "kafkajs records at the broker", Values(got), want)
	for _, r := range got {
		if c := r.Attrs.CompressionType(); c != 1 {
			t.Fatalf("record %q stored with compression codec %d, want 1 (gzip)", r.Value, c)
		}
	}
	if got := sumOffsets(committedOffsets(t, s.Kfake.Addrs, group, topic)); got != n {
		t.Errorf("kafkajs group %s committed offsets sum to %d at the broker, want %d", group, got, n)
	}
	s.AssertProxyCarried(t, kmsg.Produce, kmsg.FindCoordinator, kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Fetch, kmsg.OffsetCommit, kmsg.OffsetFetch)
}
