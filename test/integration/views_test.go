package integration

// Views on the wire, through the rtproxy binary with view rule files:
// every client of the matrix (franz-go, sarama, kafka-go, kcat,
// kafka-python, confluent-kafka, kafkajs) consumes a virtual topic in a
// group, commits, and a second run of the group resumes at the right
// record; records filtered out leave gaps, kept ones keep their offsets
// and keys, the card is masked, a record the view cannot decode arrives
// with a null value and the rtproxy-view-error header. The input is
// zstd-compressed (gzip for kafkajs, which reads no other codec without a
// plugin). An in-place view applies to the client it names only.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

const viewFile = `view: vpay.analytics
topic: vpay
steps:
  - filter: value.status != "test"
  - set:
      card: mask(value.card, 4)
`

const inPlaceViewFile = `view: vpay
topic: vpay
clients:
  client_id: [analyst]
steps:
  - filter: value.status != "test"
  - set:
      card: mask(value.card, 4)
`

// viewInputValue is record i: every 3rd has status "test" (filtered out),
// every 10th from 7 on is not JSON (the view cannot decode it).
func viewInputValue(i int) string {
	if i%10 == 7 {
		return fmt.Sprintf("not json %d", i)
	}
	status := "ok"
	if i%3 == 0 {
		status = "test"
	}
	return fmt.Sprintf(`{"n":%d,"status":%q,"card":"4111-1111-1111-%04d"}`, i, status, i)
}

func viewKept(i int) bool { return i%10 == 7 || i%3 != 0 }

// viewRec is one record as a client of the matrix reports it.
type viewRec struct {
	Partition int32       `json:"partition"`
	Offset    int64       `json:"offset"`
	Key       *string     `json:"key"`
	Value     *string     `json:"value"`
	Headers   [][2]string `json:"headers"`
}

type viewPOff struct {
	p int32
	o int64
}

// produceViewInput writes records from..from+n-1 to vpay on the broker
// itself, zstd-compressed, batched; it returns each one's index by
// partition and offset and how many a view client gets.
func produceViewInput(t *testing.T, brokers []string, from, n int, codec ...kgo.CompressionCodec) (map[viewPOff]int, int) {
	return produceViewInputWith(t, brokers, from, n, false, codec...)
}

// produceViewInputWith is produceViewInput; with single, every record
// is its own batch (produced one at a time), so the view leaves empty
// batches (all their records filtered out) between kept ones.
func produceViewInputWith(t *testing.T, brokers []string, from, n int, single bool, codec ...kgo.CompressionCodec) (map[viewPOff]int, int) {
	t.Helper()
	cl := NewClient(t, brokers, kgo.ProducerLinger(20*time.Millisecond), kgo.ProducerBatchCompression(append(codec, kgo.ZstdCompression())...),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	defer cl.Close()
	if single {
		at := map[viewPOff]int{}
		kept := 0
		for i := from; i < from+n; i++ {
			r := &kgo.Record{Topic: "vpay", Partition: 0, Key: []byte(strconv.Itoa(i)), Value: []byte(viewInputValue(i))}
			if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
				t.Fatalf("produce %d: %v", i, err)
			}
			at[viewPOff{r.Partition, r.Offset}] = i
			if viewKept(i) {
				kept++
			}
		}
		return at, kept
	}
	at := map[viewPOff]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	kept := 0
	for i := from; i < from+n; i++ {
		if viewKept(i) {
			kept++
		}
		wg.Add(1)
		cl.Produce(context.Background(), &kgo.Record{Topic: "vpay", Key: []byte(strconv.Itoa(i)), Value: []byte(viewInputValue(i))},
			func(r *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					t.Errorf("produce %d: %v", i, err)
					return
				}
				mu.Lock()
				at[viewPOff{r.Partition, r.Offset}] = i
				mu.Unlock()
			})
	}
	wg.Wait()
	return at, kept
}

// checkView checks that a client got exactly what the view makes of the
// records in at.
func checkView(t *testing.T, client string, got []viewRec, at map[viewPOff]int, want int, masked bool) {
	t.Helper()
	seen := map[viewPOff]bool{}
	for _, r := range got {
		k := viewPOff{r.Partition, r.Offset}
		if seen[k] {
			t.Errorf("%s: record %d/%d twice", client, r.Partition, r.Offset)
		}
		seen[k] = true
		i, ok := at[k]
		if !ok {
			t.Errorf("%s: record at %d/%d is not one of this run's (offsets moved, or the group did not resume)", client, r.Partition, r.Offset)
			continue
		}
		if r.Key == nil || *r.Key != strconv.Itoa(i) {
			t.Errorf("%s: record at %d/%d has key %v, want %d", client, r.Partition, r.Offset, r.Key, i)
		}
		if !masked {
			if r.Value == nil || *r.Value != viewInputValue(i) {
				t.Errorf("%s: record %d is %v, want the original %s", client, i, r.Value, viewInputValue(i))
			}
			continue
		}
		switch {
		case !viewKept(i):
			t.Errorf("%s: record %d should have been filtered out", client, i)
		case i%10 == 7:
			hasHeader := false
			for _, h := range r.Headers {
				hasHeader = hasHeader || h[0] == "rtproxy-view-error"
			}
			if r.Value != nil || !hasHeader {
				t.Errorf("%s: record %d the view cannot decode: value %v headers %v, want null and rtproxy-view-error", client, i, r.Value, r.Headers)
			}
		default:
			var v struct {
				N      int    `json:"n"`
				Status string `json:"status"`
				Card   string `json:"card"`
			}
			if r.Value == nil || json.Unmarshal([]byte(*r.Value), &v) != nil {
				t.Errorf("%s: record %d: value %v", client, i, r.Value)
				continue
			}
			if v.N != i || v.Status != "ok" || v.Card != strings.Repeat("*", 15)+fmt.Sprintf("%04d", i) {
				t.Errorf("%s: record %d: %s", client, i, *r.Value)
			}
		}
	}
	if !masked {
		want = len(at)
	}
	if len(seen) != want {
		t.Errorf("%s: got %d records, want %d", client, len(seen), want)
	}
}

// viewConsumer consumes topic in group through bootstrap until want
// records (or its deadline), commits and stops.
type viewConsumer func(t *testing.T, bootstrap, topic, group string, want int) []viewRec

func strp(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

func franzViewConsumer(clientID string) viewConsumer {
	return func(t *testing.T, bootstrap, topic, group string, want int) []viewRec {
		cl := NewClient(t, []string{bootstrap}, kgo.ClientID(clientID), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(), kgo.FetchMaxWait(300*time.Millisecond))
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out []viewRec
		for len(out) < want && ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachError(func(tp string, p int32, err error) {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("franz-go fetch %s[%d]: %v", tp, p, err)
				}
			})
			fs.EachRecord(func(r *kgo.Record) {
				vr := viewRec{Partition: r.Partition, Offset: r.Offset, Key: strp(r.Key), Value: strp(r.Value)}
				for _, h := range r.Headers {
					vr.Headers = append(vr.Headers, [2]string{h.Key, string(h.Value)})
				}
				out = append(out, vr)
			})
		}
		if err := cl.CommitUncommittedOffsets(context.Background()); err != nil {
			t.Errorf("franz-go commit: %v", err)
		}
		return out
	}
}

type saramaHandler struct {
	mu   sync.Mutex
	out  []viewRec
	want int
	done func()
}

func (h *saramaHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *saramaHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		vr := viewRec{Partition: m.Partition, Offset: m.Offset, Key: strp(m.Key), Value: strp(m.Value)}
		for _, h := range m.Headers {
			vr.Headers = append(vr.Headers, [2]string{string(h.Key), string(h.Value)})
		}
		h.mu.Lock()
		h.out = append(h.out, vr)
		if len(h.out) >= h.want {
			h.done()
		}
		h.mu.Unlock()
		s.MarkMessage(m, "")
	}
	return nil
}

func saramaViewConsumer(t *testing.T, bootstrap, topic, group string, want int) []viewRec {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.ClientID = "rtproxy-it-views-sarama"
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	cfg.Consumer.MaxWaitTime = 300 * time.Millisecond
	cg, err := sarama.NewConsumerGroup([]string{bootstrap}, group, cfg)
	if err != nil {
		t.Fatalf("sarama consumer group: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := &saramaHandler{want: want, done: cancel}
	go func() {
		for err := range cg.Errors() {
			t.Errorf("sarama: %v", err)
		}
	}()
	for ctx.Err() == nil {
		if err := cg.Consume(ctx, []string{topic}, h); err != nil && ctx.Err() == nil {
			t.Errorf("sarama consume: %v", err)
			break
		}
	}
	if err := cg.Close(); err != nil { // commits what was marked
		t.Errorf("sarama close: %v", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.out
}

func kafkaGoViewConsumer(t *testing.T, bootstrap, topic, group string, want int) []viewRec {
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: []string{bootstrap}, GroupID: group, Topic: topic,
		StartOffset: kafkago.FirstOffset, MaxWait: 300 * time.Millisecond, CommitInterval: 0})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []viewRec
	for len(out) < want {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Errorf("kafka-go after %d records: %v", len(out), err)
			break
		}
		vr := viewRec{Partition: int32(m.Partition), Offset: m.Offset, Key: strp(m.Key), Value: strp(m.Value)}
		for _, h := range m.Headers {
			vr.Headers = append(vr.Headers, [2]string{h.Key, string(h.Value)})
		}
		out = append(out, vr)
		if err := r.CommitMessages(ctx, m); err != nil {
			t.Errorf("kafka-go commit: %v", err)
		}
	}
	return out
}

func scriptViewConsumer(name string, args ...string) viewConsumer {
	return func(t *testing.T, bootstrap, topic, group string, want int) []viewRec {
		var res struct {
			Records []viewRec `json:"records"`
			Errors  []string  `json:"errors"`
		}
		cfg := mustJSON(map[string]any{"bootstrap": bootstrap, "topic": topic, "group": group, "want": want, "timeout": 30})
		runJSONClient(t, &res, 90*time.Second, name, append(args, cfg)...)
		if len(res.Errors) > 0 {
			t.Errorf("%s: %v", name, res.Errors)
		}
		return res.Records
	}
}

// kcatViewConsumer runs kcat's balanced consumer until it has want
// records; librdkafka commits on close.
func kcatViewConsumer(t *testing.T, bootstrap, topic, group string, want int) []viewRec {
	// -o would start every run there; auto.offset.reset applies only
	// to a group without committed offsets.
	out := runClient(t, "", 60*time.Second, "kcat", "-b", bootstrap, "-G", group, "-X", "auto.offset.reset=earliest", "-c", strconv.Itoa(want), "-q",
		"-X", "client.id=rtproxy-it-views-kcat", "-f", "%p\t%o\t%k\t%S\t%h\t%s\n", topic)
	var recs []viewRec
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		f := strings.SplitN(l, "\t", 6)
		if len(f) != 6 {
			continue
		}
		p, _ := strconv.Atoi(f[0])
		o, _ := strconv.ParseInt(f[1], 10, 64)
		key := f[2]
		vr := viewRec{Partition: int32(p), Offset: o, Key: &key}
		if f[3] != "-1" {
			v := f[5]
			vr.Value = &v
		}
		if f[4] != "" {
			for _, kv := range strings.Split(f[4], ",") {
				k, v, _ := strings.Cut(kv, "=")
				vr.Headers = append(vr.Headers, [2]string{k, v})
			}
		}
		recs = append(recs, vr)
	}
	return recs
}

func TestViewsClientMatrix(t *testing.T) {
	clients := []struct {
		name  string
		tool  string
		run   viewConsumer
		codec []kgo.CompressionCodec // default zstd
	}{
		// kafkajs reads gzip only (zstd takes a plugin): it runs first,
		// so that its new group reads no zstd batch.
		{"kafkajs", "kafkajs", scriptViewConsumer("node", "clients/views_kafkajs.js"), []kgo.CompressionCodec{kgo.GzipCompression()}},
		{"franz-go", "", franzViewConsumer("rtproxy-it-views-franz"), nil},
		{"sarama", "", saramaViewConsumer, nil},
		{"kafka-go", "", kafkaGoViewConsumer, nil},
		{"kcat", "kcat", kcatViewConsumer, nil},
		{"kafka-python", "python3-kafka", scriptViewConsumer(DebianPython, "clients/views_consume.py", "kafka-python"), nil},
		{"confluent-kafka", "python3-confluent-kafka", scriptViewConsumer(DebianPython, "clients/views_consume.py", "confluent"), nil},
	}
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"vpay": 3}})
	rules := t.TempDir()
	WriteRuleFile(t, rules, "vpay-analytics.yaml", viewFile)
	WriteRuleFile(t, rules, "vpay-inplace.yaml", inPlaceViewFile)
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules})
	viewsInForce(t, p.Addr)
	all := map[viewPOff]int{} // every record of vpay
	addAll := func(at map[viewPOff]int) {
		for k, v := range at {
			all[k] = v
		}
	}
	for ci, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			if c.tool != "" {
				RequireTool(t, c.tool)
			}
			group := "views-" + c.name
			// A new group starts at the start of the topic: it reads
			// what the clients before wrote too.
			at, _ := produceViewInput(t, k.Addrs, 1000*ci, 60, c.codec...)
			addAll(at)
			want := 0
			for _, i := range all {
				if viewKept(i) {
					want++
				}
			}
			checkView(t, c.name, c.run(t, p.Addr, "vpay.analytics", group, want), all, want, true)
			// The group committed: a second run resumes after it. Its
			// records are one per batch, so the view leaves empty batches
			// (as compaction does) that the client must move past.
			at2, want2 := produceViewInputWith(t, k.Addrs, 1000*ci+500, 30, true, c.codec...)
			addAll(at2)
			checkView(t, c.name+" (resumed)", c.run(t, p.Addr, "vpay.analytics", group, want2), at2, want2, true)
			// Filtered records at the end of the log: the client's fetch
			// gets only them — an empty batch for a client that declares
			// its software name (KIP-511), nothing for the others
			// (kafka-python 2.0.2 and kafka-go fail on an empty batch) —
			// and it must go on to the kept record produced after.
			filtered, keptOne := 0, 0
			for i := 1000*ci + 600; filtered < 3; i++ {
				if !viewKept(i) {
					at, _ := produceViewInputWith(t, k.Addrs, i, 1, true, c.codec...)
					addAll(at)
					filtered++
				} else if keptOne == 0 && i%10 != 7 {
					keptOne = i
				}
			}
			done := make(chan []viewRec, 1)
			go func() { done <- c.run(t, p.Addr, "vpay.analytics", group, 1) }()
			time.Sleep(3 * time.Second)
			at3, _ := produceViewInputWith(t, k.Addrs, keptOne, 1, true, c.codec...)
			addAll(at3)
			checkView(t, c.name+" (after an empty batch)", <-done, at3, 1, true)
		})
	}
	// The in-place view: the client it names gets the view's records
	// under the real name; anyone else gets the originals.
	t.Run("in-place", func(t *testing.T) {
		at, _ := produceViewInput(t, k.Addrs, 9000, 30)
		addAll(at)
		want := 0
		for _, i := range all {
			if viewKept(i) {
				want++
			}
		}
		checkView(t, "analyst", franzViewConsumer("analyst")(t, p.Addr, "vpay", "views-analyst", want), all, want, true)
		checkView(t, "someone", franzViewConsumer("someone")(t, p.Addr, "vpay", "views-someone", len(all)), all, len(all), false)
	})
}

// viewsInForce waits until the proxy lists the virtual topic.
func viewsInForce(t *testing.T, addr string) {
	t.Helper()
	cl := NewClient(t, []string{addr})
	defer cl.Close()
	Eventually(t, 30*time.Second, "the view is in force", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		md, err := kadm.NewClient(cl).Metadata(ctx, "vpay.analytics")
		if err != nil {
			return err
		}
		if t, ok := md.Topics["vpay.analytics"]; !ok || t.Err != nil {
			return fmt.Errorf("no vpay.analytics in metadata: %v", md.Topics)
		}
		return nil
	})
}
