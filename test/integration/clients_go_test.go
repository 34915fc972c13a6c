package integration

// Client cases for Go libraries, run in-process: IBM/sarama,
// segmentio/kafka-go and franz-go (classic group, KIP-848 group,
// transactional consume-transform-produce).

import (
	"context"
	"errors"
	"fmt"
	"net"
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

func TestSaramaProduceConsume(t *testing.T) {
	const topic, n = "sarama-topic", 60
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.ClientID = "rtproxy-it-sarama"
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewHashPartitioner
	cfg.Metadata.Retry.Max = 10
	cfg.Metadata.Retry.Backoff = 200 * time.Millisecond
	client, err := sarama.NewClient(s.Bootstrap, cfg)
	if err != nil {
		t.Fatalf("sarama client: %v", err)
	}
	defer client.Close()

	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatalf("sarama producer: %v", err)
	}
	var msgs []*sarama.ProducerMessage
	for i := range n {
		msgs = append(msgs, &sarama.ProducerMessage{
			Topic: topic,
			Key:   sarama.StringEncoder(fmt.Sprintf("k-%d", i)),
			Value: sarama.StringEncoder(fmt.Sprintf("sarama-%d", i)),
		})
	}
	if err := producer.SendMessages(msgs); err != nil {
		t.Fatalf("sarama SendMessages: %v", err)
	}
	producer.Close()
	want := expectedValues("sarama", n)

	// Content at the broker, read independently with franz-go.
	AssertSameSet(t, "sarama-produced records at the broker", Values(Consume(t, s.Kfake.Addrs, topic, n, 20*time.Second)), want)

	// Consume every partition with sarama from the oldest offset.
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatalf("sarama consumer: %v", err)
	}
	defer consumer.Close()
	parts, err := client.Partitions(topic)
	if err != nil || len(parts) != 3 {
		t.Fatalf("sarama partitions of %s: %v %v", topic, parts, err)
	}
	var got []string
	for _, p := range parts {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatalf("sarama GetOffset %d: %v", p, err)
		}
		if hwm == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("sarama ConsumePartition %d: %v", p, err)
		}
		timeout := time.After(20 * time.Second)
	read:
		for {
			select {
			case m := <-pc.Messages():
				if string(m.Key) != "k-"+strings.TrimPrefix(string(m.Value), "sarama-") {
					t.Errorf("sarama record key %q does not match value %q", m.Key, m.Value)
				}
				got = append(got, string(m.Value))
				if m.Offset == hwm-1 {
					break read
				}
			case err := <-pc.Errors():
				t.Fatalf("sarama partition %d: %v", p, err)
			case <-timeout:
				t.Fatalf("sarama partition %d: timed out at %d records", p, len(got))
			}
		}
		pc.Close()
	}
	AssertSameSet(t, "sarama-consumed records", got, want)
	s.AssertProxyCarried(t, kmsg.Metadata, kmsg.Produce, kmsg.ListOffsets, kmsg.Fetch)

	var seen []string
	for _, b := range client.Brokers() {
		seen = append(seen, b.Addr())
	}
	if ctrl, err := client.Controller(); err == nil {
		seen = append(seen, ctrl.Addr())
	}
	s.AssertOnlyProxyAddrs(t, seen)
}

func TestKafkaGoGroupReader(t *testing.T) {
	const topic, group, n = "kafkago-topic", "kafkago-group", 45
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})
	want := Produce(t, s.Kfake.Addrs, topic, "kafkago", n)

	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:        s.Bootstrap,
		GroupID:        group,
		Topic:          topic,
		StartOffset:    kafkago.FirstOffset,
		MaxWait:        200 * time.Millisecond,
		CommitInterval: 0, // synchronous commits: ReadMessage commits before returning
	})
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var got []string
	for len(got) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			r.Close()
			t.Fatalf("kafka-go ReadMessage after %d records: %v", len(got), err)
		}
		got = append(got, string(m.Value))
	}
	if err := r.Close(); err != nil {
		t.Errorf("kafka-go reader close: %v", err)
	}
	AssertSameSet(t, "kafka-go group reader records", got, want)
	if c := sumOffsets(committedOffsets(t, s.Kfake.Addrs, group, topic)); c != n {
		t.Errorf("kafka-go group committed offsets sum to %d at the broker, want %d", c, n)
	}
	s.AssertProxyCarried(t, kmsg.FindCoordinator, kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Fetch, kmsg.OffsetCommit)

	// What kafka-go learns about brokers and the controller.
	conn, err := kafkago.Dial("tcp", s.Bootstrap[0])
	if err != nil {
		t.Fatalf("kafka-go dial: %v", err)
	}
	defer conn.Close()
	brokers, err := conn.Brokers()
	if err != nil {
		t.Fatalf("kafka-go brokers: %v", err)
	}
	var seen []string
	for _, b := range brokers {
		seen = append(seen, net.JoinHostPort(b.Host, strconv.Itoa(b.Port)))
	}
	if ctrl, err := conn.Controller(); err == nil {
		seen = append(seen, net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	}
	s.AssertOnlyProxyAddrs(t, seen)
}

// apiKeyRecorder is a franz-go hook that records which request keys a client
// wrote and to which broker addresses it connected.
type apiKeyRecorder struct {
	mu    sync.Mutex
	keys  map[int16]int
	addrs map[string]bool
}

func newAPIKeyRecorder() *apiKeyRecorder {
	return &apiKeyRecorder{keys: map[int16]int{}, addrs: map[string]bool{}}
}

func (h *apiKeyRecorder) OnBrokerWrite(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.keys[key]++
	}
	h.addrs[net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))] = true
}

func (h *apiKeyRecorder) count(k kmsg.Key) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.keys[int16(k)]
}

func (h *apiKeyRecorder) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for a := range h.addrs {
		out = append(out, a)
	}
	return out
}

// franzGroupConsume consumes n records of topic in group through the stack,
// commits, and returns the values and the hook's record of the session.
func franzGroupConsume(t *testing.T, s *Stack, topic, group string, n int, extra ...kgo.Opt) ([]string, *apiKeyRecorder, *kgo.Client) {
	t.Helper()
	hook := newAPIKeyRecorder()
	opts := append([]kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.WithHooks(hook),
	}, extra...)
	cl := NewClient(t, s.Bootstrap, opts...)
	got := Values(PollN(t, cl, n, 45*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return got, hook, cl
}

func TestFranzGoClassicGroup(t *testing.T) {
	const topic, group, n = "franz-classic", "franz-classic-group", 60
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})
	want := Produce(t, s.Bootstrap, topic, "classic", n)

	got, hook, cl := franzGroupConsume(t, s, topic, group, n)
	AssertSameSet(t, "franz-go classic group records", got, want)
	if hook.count(kmsg.JoinGroup) == 0 || hook.count(kmsg.SyncGroup) == 0 {
		t.Errorf("classic group sent JoinGroup %d times and SyncGroup %d times; want both > 0",
			hook.count(kmsg.JoinGroup), hook.count(kmsg.SyncGroup))
	}
	if c := sumOffsets(committedOffsets(t, s.Kfake.Addrs, group, topic)); c != n {
		t.Errorf("classic group committed offsets sum to %d at the broker, want %d", c, n)
	}
	s.AssertProxyCarried(t, kmsg.JoinGroup, kmsg.SyncGroup, kmsg.OffsetCommit)
	seen := append(hook.seen(), MetadataBrokers(t, cl)...)
	seen = append(seen, CoordinatorAddrs(t, cl, group)...)
	s.AssertOnlyProxyAddrs(t, seen)
}

func TestFranzGoKIP848Group(t *testing.T) {
	const topic, group, n = "franz-848", "franz-848-group", 60
	s := StartStack(t, KfakeOpts{Topics: map[string]int{topic: 3}}, ProxyOpts{})
	want := Produce(t, s.Bootstrap, topic, "nextgen", n)

	got, hook, cl := franzGroupConsume(t, s, topic, group, n,
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer())
	AssertSameSet(t, "franz-go KIP-848 group records", got, want)
	// The next-gen protocol is ConsumerGroupHeartbeat instead of Join/Sync.
	if hb, jg := hook.count(kmsg.ConsumerGroupHeartbeat), hook.count(kmsg.JoinGroup); hb == 0 || jg != 0 {
		t.Errorf("KIP-848 group sent ConsumerGroupHeartbeat %d times and JoinGroup %d times; want >0 and 0", hb, jg)
	}
	if c := sumOffsets(committedOffsets(t, s.Kfake.Addrs, group, topic)); c != n {
		t.Errorf("KIP-848 group committed offsets sum to %d at the broker, want %d", c, n)
	}
	s.AssertProxyCarried(t, kmsg.ConsumerGroupHeartbeat, kmsg.OffsetCommit, kmsg.Fetch)
	seen := append(hook.seen(), MetadataBrokers(t, cl)...)
	seen = append(seen, CoordinatorAddrs(t, cl, group)...)
	s.AssertOnlyProxyAddrs(t, seen)
}

func TestFranzGoTransactionalConsumeTransformProduce(t *testing.T) {
	const src, dst, group, n = "eos-in", "eos-out", "eos-group", 90
	s := StartStack(t, KfakeOpts{Topics: map[string]int{src: 3, dst: 3}}, ProxyOpts{})
	inputs := Produce(t, s.Bootstrap, src, "in", n)

	// An aborted transaction already sits in the output topic: read_committed
	// consumers must never see it.
	junk := NewClient(t, s.Bootstrap, kgo.TransactionalID("eos-junk"), kgo.DefaultProduceTopic(dst))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := junk.BeginTransaction(); err != nil {
		t.Fatalf("begin junk transaction: %v", err)
	}
	for i := range 10 {
		junk.Produce(ctx, &kgo.Record{Value: fmt.Appendf(nil, "junk-%d", i)}, nil)
	}
	if err := junk.Flush(ctx); err != nil {
		t.Fatalf("flush junk: %v", err)
	}
	if err := junk.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatalf("abort junk transaction: %v", err)
	}

	hook := newAPIKeyRecorder()
	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(s.Bootstrap...),
		kgo.ProducerLinger(0),
		kgo.TransactionalID("eos-transformer"),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(src),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.DefaultProduceTopic(dst),
		kgo.WithHooks(hook),
	)
	if err != nil {
		t.Fatalf("group transact session: %v", err)
	}
	defer sess.Close()

	transformed := 0
	for transformed < n {
		fs := sess.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("transformed %d of %d before timeout", transformed, n)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Logf("fetch %s[%d]: %v", tp, p, err) })
		recs := fs.Records()
		if len(recs) == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			t.Fatalf("begin: %v", err)
		}
		var perr error
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, r := range recs {
			wg.Add(1)
			out := &kgo.Record{Key: r.Key, Value: []byte("OUT:" + strings.ToUpper(string(r.Value)))}
			sess.Produce(ctx, out, func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					mu.Lock()
					perr = errors.Join(perr, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		committed, err := sess.End(ctx, kgo.TransactionEndTry(perr == nil))
		if err != nil {
			t.Fatalf("end transaction: %v", err)
		}
		if committed {
			transformed += len(recs)
		} else {
			t.Logf("transaction of %d records aborted (produce error: %v); the session re-polls them", len(recs), perr)
		}
	}
	if transformed != n {
		t.Fatalf("transformed %d records, want %d", transformed, n)
	}

	var want []string
	for _, v := range inputs {
		want = append(want, "OUT:"+strings.ToUpper(v))
	}
	rc := ConsumeQuiet(t, s.Bootstrap, dst, n, 1500*time.Millisecond, 30*time.Second, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	AssertSameSet(t, "read_committed output", Values(rc), want)
	ru := ConsumeQuiet(t, s.Kfake.Addrs, dst, n+10, 1500*time.Millisecond, 30*time.Second)
	if len(ru) != n+10 {
		t.Errorf("read_uncommitted output has %d records, want %d transformed + 10 aborted", len(ru), n)
	}
	if c := sumOffsets(committedOffsets(t, s.Kfake.Addrs, group, src)); c != n {
		t.Errorf("transactional group committed offsets sum to %d, want %d", c, n)
	}
	if hook.count(kmsg.TxnOffsetCommit) == 0 || hook.count(kmsg.EndTxn) == 0 {
		t.Errorf("session sent TxnOffsetCommit %d and EndTxn %d times; want both > 0", hook.count(kmsg.TxnOffsetCommit), hook.count(kmsg.EndTxn))
	}
	// No AddPartitionsToTxn/AddOffsetsToTxn: with KIP-890 (transactions v2)
	// franz-go adds partitions implicitly.
	s.AssertProxyCarried(t, kmsg.InitProducerID, kmsg.Produce, kmsg.TxnOffsetCommit, kmsg.EndTxn)
	s.AssertOnlyProxyAddrs(t, hook.seen())
}
