package integration

// The client matrix reading padded node endpoints. A large Fetch v16+
// response streams through the proxy with its KIP-951 endpoints rewritten
// in place, padded with an unknown tagged field to keep the frame's length
// (protocol/stream.go). kfake sends no endpoints, so the broker here is
// kfake behind endpointShim, which adds them to every Fetch v16+ and
// Produce v10+ response under a host longer than the proxy's.
//
// Every client consumes the same large records through the proxy; the
// test asserts what each received (count, bytes, values), logs the Fetch
// versions it asked for (seen by the shim), and, for a client at v16 or
// later, that the proxy padded endpoints in its responses
// (rtproxy_proxy_endpoints_padded_total). Clients that cap Fetch below
// v16 cannot be sent endpoints at all; the test says so in its log.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	paddedRecords   = 300
	paddedValueSize = 4096
)

func paddedValue(i int) string {
	head := fmt.Sprintf("padded-%05d:", i)
	return head + strings.Repeat(string(rune('a'+i%26)), paddedValueSize-len(head))
}

var paddedMetric = regexp.MustCompile(`(?m)^rtproxy_proxy_endpoints_padded_total (\S+)$`)

func paddedCount(t *testing.T, p *Proxy) float64 {
	t.Helper()
	m := paddedMetric.FindStringSubmatch(p.Metrics(t))
	if m == nil {
		t.Fatal("/metrics has no rtproxy_proxy_endpoints_padded_total")
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkPaddedValues asserts that a client received every record once,
// whole.
func checkPaddedValues(t *testing.T, client string, got []string) {
	t.Helper()
	want := make([]string, paddedRecords)
	for i := range want {
		want[i] = paddedValue(i)
	}
	bytes := 0
	for _, v := range got {
		bytes += len(v)
	}
	if len(got) != paddedRecords || bytes != paddedRecords*paddedValueSize {
		t.Errorf("%s received %d records, %d bytes; want %d records, %d bytes", client, len(got), bytes, paddedRecords, paddedRecords*paddedValueSize)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Errorf("%s: record %q (%d bytes) is not the one produced (%q)", client, got[i][:min(len(got[i]), 20)], len(got[i]), want[i][:20])
				break
			}
		}
		if len(got) == len(want) {
			t.Errorf("%s: the records received differ from those produced", client)
		}
	}
}

// TestPaddedEndpointsClientMatrix: kfake (one broker) behind the endpoint
// shim behind rtproxy; franz-go produces 300 records of 4 KiB through the
// proxy, then each client consumes them all through it.
func TestPaddedEndpointsClientMatrix(t *testing.T) {
	const topic = "padded"
	k := StartKfake(t, KfakeOpts{Brokers: 1, Topics: map[string]int{topic: 2}})
	shim := startEndpointShim(t, k.Addrs[0], "::ffff:127.0.0.1")
	p := StartProxy(t, ProxyOpts{Upstream: []string{shim.Addr}})
	boot := p.Addr

	// Produce through the proxy: Produce v10+ responses carry endpoints
	// (held and re-encoded by the proxy, they are small).
	shim.reset()
	// Batches of at most 64 KiB, so that a fetch can stop between them.
	prod := NewClient(t, []string{boot}, kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()),
		kgo.ProducerBatchMaxBytes(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var rs []*kgo.Record
	for i := range paddedRecords {
		rs = append(rs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k-%d", i), Value: []byte(paddedValue(i))})
	}
	if err := prod.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	prod.Close()
	pv := shim.versions(kmsg.Produce)
	t.Logf("franz-go produced with Produce versions %v; %d responses carried endpoints", pv, shim.added(kmsg.Produce))
	if shim.added(kmsg.Produce) == 0 {
		t.Errorf("no Produce response carried endpoints (versions %v): the producer did not use v10+", pv)
	}

	type result struct {
		fetch  map[int16]int
		padded float64
	}
	var mu sync.Mutex
	results := map[string]result{}
	run := func(name string, consume func(t *testing.T) []string, atLeast16 bool) {
		t.Run(name, func(t *testing.T) {
			shim.reset()
			before := paddedCount(t, p)
			got := consume(t)
			checkPaddedValues(t, name, got)
			padded := paddedCount(t, p) - before
			fv := shim.versions(kmsg.Fetch)
			maxV := slices.Max(slices.Collect(maps.Keys(fv)))
			mu.Lock()
			results[name] = result{fv, padded}
			mu.Unlock()
			switch {
			case maxV >= 16:
				t.Logf("%s: Fetch versions %v, %d responses given endpoints by the broker, %v endpoints padded by the proxy", name, fv, shim.added(kmsg.Fetch), padded)
				if shim.added(kmsg.Fetch) == 0 || padded == 0 {
					t.Errorf("%s fetched at v%d but the proxy padded %v endpoints (%d responses carried them)", name, maxV, padded, shim.added(kmsg.Fetch))
				}
			case atLeast16:
				t.Errorf("%s fetched with versions %v, want 16 or later", name, fv)
			default:
				t.Logf("%s: Fetch versions %v, below 16: its responses cannot carry endpoints (KIP-951 is Fetch v16+), nothing to pad", name, fv)
			}
		})
	}

	run("franz-go", func(t *testing.T) []string {
		// Responses of at most 256 KiB (128 KiB a partition): many
		// fetches, each over the 64 KiB from which the proxy streams.
		cl := NewClient(t, []string{boot}, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxBytes(256<<10), kgo.FetchMaxPartitionBytes(128<<10))
		defer cl.Close()
		return Values(PollN(t, cl, paddedRecords, 60*time.Second))
	}, true)

	kcat := func(t *testing.T) []string {
		RequireTool(t, "kcat")
		out := runClient(t, "", 60*time.Second, "kcat", "-C", "-b", boot, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%S|%s\n")
		var vals []string
		for _, l := range strings.Split(strings.TrimSuffix(string(out), "\n"), "\n") {
			size, v, ok := strings.Cut(l, "|")
			if !ok || size != strconv.Itoa(len(v)) {
				t.Fatalf("kcat line %.40q: size %q does not match the value's %d bytes", l, size, len(v))
			}
			vals = append(vals, v)
		}
		return vals
	}
	run("kcat", kcat, false)

	run("kafka-python", func(t *testing.T) []string {
		RequireTool(t, "python3-kafka")
		var res struct {
			Records []scriptRecord `json:"records"`
		}
		runJSONClient(t, &res, 90*time.Second, DebianPython, "clients/kafka_python_group.py",
			mustJSON(map[string]any{"bootstrap": boot, "topic": topic, "group": "padded-kp", "want": paddedRecords, "timeout": 60}))
		return recordValues(res.Records)
	}, false)

	confluent := func(group string) func(t *testing.T) []string {
		return func(t *testing.T) []string {
			RequireTool(t, "python3-confluent-kafka")
			var res struct {
				Values []string `json:"values"`
				Errors []string `json:"errors"`
			}
			runJSONClient(t, &res, 90*time.Second, DebianPython, "clients/confluent_consume.py",
				mustJSON(map[string]any{"bootstrap": boot, "topic": topic, "group": group, "isolation": "read_uncommitted", "timeout": 60}))
			if len(res.Errors) > 0 {
				t.Errorf("confluent-kafka consumer errors: %v", res.Errors)
			}
			return res.Values
		}
	}
	run("confluent-kafka", confluent("padded-cf"), false)

	// Debian's librdkafka (2.0.2) fetches at v11. A newer one (2.4 or
	// later reads Fetch v16) in RTPROXY_IT_LIBRDKAFKA (a directory holding
	// librdkafka.so.1) runs kcat and confluent-kafka again on it: they
	// load it in place of the system's, and must then fetch at v16.
	if dir := os.Getenv("RTPROXY_IT_LIBRDKAFKA"); dir != "" {
		withLib := func(f func(t *testing.T) []string) func(t *testing.T) []string {
			return func(t *testing.T) []string {
				t.Setenv("LD_LIBRARY_PATH", dir)
				return f(t)
			}
		}
		run("kcat-RTPROXY_IT_LIBRDKAFKA", withLib(kcat), true)
		run("confluent-kafka-RTPROXY_IT_LIBRDKAFKA", withLib(confluent("padded-cf-new")), true)
	}

	run("sarama", func(t *testing.T) []string {
		cfg := sarama.NewConfig()
		cfg.Version = sarama.MaxVersion
		cfg.ClientID = "rtproxy-it-sarama-padded"
		cfg.Consumer.Return.Errors = true
		c, err := sarama.NewConsumer([]string{boot}, cfg)
		if err != nil {
			t.Fatalf("sarama consumer: %v", err)
		}
		defer c.Close()
		parts, err := c.Partitions(topic)
		if err != nil {
			t.Fatal(err)
		}
		msgs := make(chan string, paddedRecords)
		for _, part := range parts {
			pc, err := c.ConsumePartition(topic, part, sarama.OffsetOldest)
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			go func() {
				for m := range pc.Messages() {
					msgs <- string(m.Value)
				}
			}()
			go func() {
				for err := range pc.Errors() {
					t.Errorf("sarama partition %d: %v", part, err)
				}
			}()
		}
		var vals []string
		timeout := time.After(60 * time.Second)
		for len(vals) < paddedRecords {
			select {
			case v := <-msgs:
				vals = append(vals, v)
			case <-timeout:
				t.Fatalf("sarama: %d of %d records within 60s", len(vals), paddedRecords)
			}
		}
		return vals
	}, false)

	run("kafka-go", func(t *testing.T) []string {
		r := kafkago.NewReader(kafkago.ReaderConfig{
			Brokers:     []string{boot},
			GroupID:     "padded-kafkago",
			Topic:       topic,
			StartOffset: kafkago.FirstOffset,
			MaxBytes:    4 << 20,
			MaxWait:     200 * time.Millisecond,
		})
		defer r.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var vals []string
		for len(vals) < paddedRecords {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				t.Fatalf("kafka-go after %d records: %v", len(vals), err)
			}
			vals = append(vals, string(m.Value))
		}
		return vals
	}, false)

	run("kafkajs", func(t *testing.T) []string {
		RequireTool(t, "kafkajs")
		var res struct {
			Values []string `json:"values"`
		}
		runJSONClient(t, &res, 90*time.Second, "node", "clients/kafkajs_consume.js",
			mustJSON(map[string]any{"bootstrap": boot, "topic": topic, "group": "padded-kjs", "want": paddedRecords, "timeout": 60}))
		return res.Values
	}, false)

	names := slices.Sorted(maps.Keys(results))
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "\n  %-16s Fetch versions %v, endpoints padded %v", n, results[n].fetch, results[n].padded)
	}
	t.Logf("client matrix (Produce by franz-go at %v):%s", pv, b.String())
}
