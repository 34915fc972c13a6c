package integration

// Helpers of the shared-routes tests (shared_routes_test.go): several real
// rtproxy binaries that share each route through the route's consumer group
// rtproxy.<route>, its <route>.<NN>-<kind>.repartition topics and its
// changelogs. Everything here observes from the outside: the sinks, the
// group's committed offsets at the broker, /routes and /metrics.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// --- events ----------------------------------------------------------------

// srBaseTS is the event time of id 0. Event time is derived from the id, so
// that the recomputation does not depend on when a record was produced, and
// grows with the id, so that every source partition sees its event times in
// increasing order (the producer writes ids in order and keeps the order of
// each partition): with watermark 0s no record can be late unless an
// upstream partition was wrongly judged idle.
const srBaseTS = int64(1_700_000_000_000)

// srEvent is one source record's value.
type srEvent struct {
	ID     int    `json:"id"`
	User   string `json:"user"`   // the window key: not the Kafka key
	Amount int    `json:"amount"` // integers, so sums compare exactly
	TS     int64  `json:"ts"`     // event time, epoch ms
	DK     string `json:"dk"`     // the drop_duplicates key: not the Kafka key
}

// srGen makes events: event time advances msPerID per id; the dedup key
// repeats every dupEvery ids (0: every key is unique).
func srGen(msPerID int64, dupEvery int) func(id int) srEvent {
	return func(id int) srEvent {
		dk := "d" + strconv.Itoa(id)
		if dupEvery > 0 {
			dk = "d" + strconv.Itoa(id%dupEvery)
		}
		return srEvent{ID: id, User: "u" + strconv.Itoa(id%7), Amount: id%13 + 1, TS: srBaseTS + int64(id)*msPerID, DK: dk}
	}
}

// srRandKey is a random Kafka key: the records of one window key or one
// dedup key land on every source partition.
func srRandKey() []byte { return fmt.Appendf(nil, "r%016x", rand.Uint64()) }

func srRecord(topic string, e srEvent) *kgo.Record {
	b, _ := json.Marshal(e)
	return &kgo.Record{Topic: topic, Key: srRandKey(), Value: b}
}

// srProduce writes events synchronously, in order.
func srProduce(t *testing.T, seeds []string, topic string, evs []srEvent) {
	t.Helper()
	cl := NewClient(t, seeds, kgo.ProducerBatchCompression(kgo.NoCompression()))
	defer cl.Close()
	rs := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		rs[i] = srRecord(topic, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce %d records to %s: %v", len(rs), topic, err)
	}
}

// srFlushUser is the window key of the flush records, left out of every
// comparison (their windows are far ahead and need not close).
const srFlushUser = "flush"

// srFlush writes one record on every partition of topic with event time ts
// (far ahead of the data): every writer's frontier then passes every data
// window, so they all close without relying on idle_timeout. Flush ids are
// multiples of 5 (the stateless route filters them out) and their dedup keys
// unique.
func srFlush(t *testing.T, seeds []string, topic string, parts int, ts int64) {
	t.Helper()
	cl := NewClient(t, seeds, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchCompression(kgo.NoCompression()))
	defer cl.Close()
	var rs []*kgo.Record
	for p := 0; p < parts; p++ {
		e := srEvent{ID: 5 * (100_000_000 + p), User: srFlushUser, Amount: 0, TS: ts, DK: fmt.Sprintf("flush-%d-%d", ts, p)}
		r := srRecord(topic, e)
		r.Partition = int32(p)
		rs = append(rs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("flush %s: %v", topic, err)
	}
}

// srLoad produces events at a steady rate in the background, straight to
// the brokers, retrying through broker restarts.
type srLoad struct {
	acked    atomic.Int64
	stopOnce sync.Once
	stopc    chan struct{}
	done     chan struct{}
	err      atomic.Value
}

func srStartLoad(t *testing.T, seeds []string, topic string, rate, max int, gen func(int) srEvent) *srLoad {
	t.Helper()
	cl := NewClient(t, seeds, kgo.RecordRetries(1<<30), kgo.RequestTimeoutOverhead(2*time.Second),
		kgo.ProducerBatchCompression(kgo.NoCompression()))
	l := &srLoad{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		var wg sync.WaitGroup
		start := time.Now()
	loop:
		for i := 0; i < max; i++ {
			select {
			case <-l.stopc:
				break loop
			default:
			}
			if due := start.Add(time.Duration(i) * time.Second / time.Duration(rate)); time.Until(due) > 0 {
				time.Sleep(time.Until(due))
			}
			wg.Add(1)
			cl.Produce(context.Background(), srRecord(topic, gen(i)), func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					l.err.CompareAndSwap(nil, err)
					return
				}
				l.acked.Add(1)
			})
		}
		wg.Wait()
	}()
	t.Cleanup(func() { l.stopOnce.Do(func() { close(l.stopc) }); <-l.done })
	return l
}

// Stop ends the load and waits until everything sent is acknowledged.
func (l *srLoad) Stop(t *testing.T) {
	t.Helper()
	l.stopOnce.Do(func() { close(l.stopc) })
	l.Wait(t, 60*time.Second)
}

// Wait waits for the load to end by itself (or after Stop).
func (l *srLoad) Wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(timeout):
		t.Fatalf("producer did not finish within %v (%d acked)", timeout, l.acked.Load())
	}
	if e := l.err.Load(); e != nil {
		t.Fatalf("producer: %v", e)
	}
}

// WaitAcked waits until at least n records are acknowledged.
func (l *srLoad) WaitAcked(t *testing.T, n int64, timeout time.Duration) {
	t.Helper()
	srWait(t, timeout, fmt.Sprintf("%d records produced", n), func() error {
		if got := l.acked.Load(); got < n {
			return fmt.Errorf("%d acked", got)
		}
		return nil
	})
}

// --- rule files ------------------------------------------------------------

// srRoute names one route of a test and the topics around it.
type srRoute struct {
	Name, Source, Sink, DLQ string
	Keyed                   bool // has a window or drop_duplicates step
}

func (r srRoute) Group() string { return "rtproxy." + r.Name }

// srStateless is a per-record route: filter + set.
func srStateless(t *testing.T, dir, source string) srRoute {
	r := srRoute{Name: source + "-rec", Source: source, Sink: source + ".rec", DLQ: source + ".rec.dlq"}
	WriteRuleFile(t, dir, r.Name+".yaml", fmt.Sprintf(`route: %s
source: { topic: %s, format: json, event_time: value.ts, idle_timeout: 20s }
sink: { topic: %s }
dead_letter: %s
checkpoint_interval: 1s
steps:
  - filter: int(value.id) %% 5 != 0
  - set: { tag: '"kept"' }
`, r.Name, r.Source, r.Sink, r.DLQ))
	return r
}

// srWindow is a tumbling 1s window keyed by value.user (not the Kafka key),
// emitted on close, with event time from the value and no lateness.
func srWindow(t *testing.T, dir, source, idle string) srRoute {
	r := srRoute{Name: source + "-win", Source: source, Sink: source + ".win", DLQ: source + ".win.dlq", Keyed: true}
	WriteRuleFile(t, dir, r.Name+".yaml", fmt.Sprintf(`route: %s
source: { topic: %s, format: json, event_time: value.ts, watermark: 0s, idle_timeout: %s }
sink: { topic: %s }
dead_letter: %s
checkpoint_interval: 1s
steps:
  - window: { kind: tumbling, size: 1s, key: value.user, aggregate: { n: count(), total: sum(value.amount) } }
`, r.Name, r.Source, idle, r.Sink, r.DLQ))
	return r
}

// srDedup is a drop_duplicates on value.dk (not the Kafka key), no ttl.
func srDedup(t *testing.T, dir, source, idle string) srRoute {
	r := srRoute{Name: source + "-dd", Source: source, Sink: source + ".dd", DLQ: source + ".dd.dlq", Keyed: true}
	WriteRuleFile(t, dir, r.Name+".yaml", fmt.Sprintf(`route: %s
source: { topic: %s, format: json, event_time: value.ts, idle_timeout: %s }
sink: { topic: %s }
dead_letter: %s
checkpoint_interval: 1s
steps:
  - drop_duplicates: { key: value.dk }
`, r.Name, r.Source, idle, r.Sink, r.DLQ))
	return r
}

// srTopics is what a test creates up front: the source with parts
// partitions, and each route's sink (4 partitions) and dead-letter topic.
// Repartition and changelog topics are the pipeline's to create.
func srTopics(source string, parts int) map[string]int {
	m := map[string]int{source: parts}
	for _, s := range []string{".rec", ".win", ".dd"} {
		m[source+s] = 4
		m[source+s+".dlq"] = 1
	}
	return m
}

// srStartProxies starts n rtproxy instances on the same rules and
// upstream, each with its own state dir and ports.
func srStartProxies(t *testing.T, k *Kfake, rulesDir string, n int, env ...string) []*Proxy {
	t.Helper()
	var ps []*Proxy
	for i := 0; i < n; i++ {
		ps = append(ps, StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rulesDir, StateDir: t.TempDir(), Env: env}))
	}
	return ps
}

// --- polling ---------------------------------------------------------------

// srWait retries cond every 250ms (gentler than Eventually on 2 cores,
// since conditions read topics) until it returns nil or timeout passes.
func srWait(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := cond()
		if err == nil {
			if d := time.Since(start); d > 2*time.Second {
				t.Logf("%s: took %v", what, d.Round(time.Millisecond))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v: %v", what, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// --- broker-side views -----------------------------------------------------

// srAdmin runs fn with a short-lived admin client.
func srAdmin(seeds []string, fn func(ctx context.Context, adm *kadm.Client) error) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return fn(ctx, kadm.NewClient(cl))
}

// srOffsets is topic → partition → offset.
type srOffsets map[string]map[int32]int64

func (o srOffsets) String() string {
	var ts []string
	for t := range o {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	var b strings.Builder
	for _, t := range ts {
		var ps []int
		for p := range o[t] {
			ps = append(ps, int(p))
		}
		sort.Ints(ps)
		fmt.Fprintf(&b, "%s[", t)
		for i, p := range ps {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%d:%d", p, o[t][int32(p)])
		}
		b.WriteString("] ")
	}
	return strings.TrimSpace(b.String())
}

// srEnds returns the end offsets of topics.
func srEnds(seeds []string, topics ...string) (srOffsets, error) {
	out := srOffsets{}
	err := srAdmin(seeds, func(ctx context.Context, adm *kadm.Client) error {
		lo, err := adm.ListEndOffsets(ctx, topics...)
		if err == nil {
			err = lo.Error()
		}
		if err != nil {
			return err
		}
		lo.Each(func(o kadm.ListedOffset) {
			if out[o.Topic] == nil {
				out[o.Topic] = map[int32]int64{}
			}
			out[o.Topic][o.Partition] = o.Offset
		})
		return nil
	})
	return out, err
}

func srMustEnds(t *testing.T, seeds []string, topics ...string) srOffsets {
	t.Helper()
	var out srOffsets
	srWait(t, 20*time.Second, "end offsets of "+strings.Join(topics, ","), func() (err error) {
		out, err = srEnds(seeds, topics...)
		return err
	})
	return out
}

// srCommitted returns the offsets the group committed at the broker.
func srCommitted(seeds []string, group string) (srOffsets, error) {
	out := srOffsets{}
	err := srAdmin(seeds, func(ctx context.Context, adm *kadm.Client) error {
		os, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return err
		}
		os.Each(func(o kadm.OffsetResponse) {
			if o.Err != nil || o.At < 0 {
				return
			}
			if out[o.Topic] == nil {
				out[o.Topic] = map[int32]int64{}
			}
			out[o.Topic][o.Partition] = o.At
		})
		return nil
	})
	return out, err
}

// srTopicsLike lists the topics named prefix…suffix with their partition
// counts.
func srTopicsLike(seeds []string, prefix, suffix string) (map[string]int, error) {
	out := map[string]int{}
	err := srAdmin(seeds, func(ctx context.Context, adm *kadm.Client) error {
		ds, err := adm.ListTopics(ctx)
		if err != nil {
			return err
		}
		for name, d := range ds {
			if strings.HasPrefix(name, prefix) && strings.HasSuffix(name, suffix) && d.Err == nil {
				out[name] = len(d.Partitions)
			}
		}
		return nil
	})
	return out, err
}

// srGroupTopics returns the topics of the route's group with their
// partition counts: its source and, for a keyed route, its repartition
// topics (waiting until the pipeline has created at least one).
func srGroupTopics(t *testing.T, seeds []string, r srRoute) map[string]int {
	t.Helper()
	var out map[string]int
	srWait(t, 30*time.Second, r.Name+": its source and repartition topics exist", func() error {
		rp, err := srTopicsLike(seeds, r.Name+".", ".repartition")
		if err != nil {
			return err
		}
		src, err := srTopicsLike(seeds, r.Source, "")
		if err != nil {
			return err
		}
		if src[r.Source] == 0 {
			return fmt.Errorf("no source topic %s", r.Source)
		}
		if r.Keyed && len(rp) == 0 {
			return fmt.Errorf("no topic %s.<NN>-<kind>.repartition", r.Name)
		}
		out = map[string]int{r.Source: src[r.Source]}
		for n, c := range rp {
			out[n] = c
		}
		return nil
	})
	return out
}

func srTopicNames(m map[string]int) []string {
	var ts []string
	for n := range m {
		ts = append(ts, n)
	}
	sort.Strings(ts)
	return ts
}

// srWaitCommittedAtLeast waits until the group has committed at least want
// on every partition of want.
func srWaitCommittedAtLeast(t *testing.T, seeds []string, group string, want srOffsets, timeout time.Duration) {
	t.Helper()
	srWait(t, timeout, group+" commits at least "+want.String(), func() error {
		got, err := srCommitted(seeds, group)
		if err != nil {
			return err
		}
		var behind []string
		for tp, ps := range want {
			for p, w := range ps {
				c, ok := got[tp][p]
				if w > 0 && (!ok || c < w) {
					behind = append(behind, fmt.Sprintf("%s[%d] committed %d (set %v) < %d", tp, p, c, ok, w))
				}
			}
		}
		if len(behind) > 0 {
			sort.Strings(behind)
			return fmt.Errorf("%d partitions behind: %s", len(behind), strings.Join(behind[:min(len(behind), 6)], "; "))
		}
		return nil
	})
}

// srWaitCaughtUp waits until the route has done, and committed to its
// group, everything in its source and then everything its writers put in
// its repartition topics by then: every output of every source record is
// then acknowledged (checkpoint order: outputs, changelog, local, group).
// The producer must have stopped.
func srWaitCaughtUp(t *testing.T, seeds []string, r srRoute, timeout time.Duration) {
	t.Helper()
	topics := srGroupTopics(t, seeds, r)
	src := srMustEnds(t, seeds, r.Source)
	srWaitCommittedAtLeast(t, seeds, r.Group(), src, timeout)
	var rps []string
	for _, n := range srTopicNames(topics) {
		if n != r.Source {
			rps = append(rps, n)
		}
	}
	if len(rps) > 0 {
		srWaitCommittedAtLeast(t, seeds, r.Group(), srMustEnds(t, seeds, rps...), timeout)
	}
}

// --- reading topics --------------------------------------------------------

// srRead reads every committed record of topic, up to the end offsets it
// had when no transaction was open on it (at once for a topic that no
// transactional producer writes). Commit and abort markers are read too
// (and dropped), so the read knows where each partition ends.
func srRead(t *testing.T, seeds []string, topic string) []*kgo.Record {
	t.Helper()
	var ends map[int32]int64
	srWait(t, 60*time.Second, topic+": no transaction open", func() error {
		return srAdmin(seeds, func(ctx context.Context, adm *kadm.Client) error {
			hw, err := adm.ListEndOffsets(ctx, topic)
			if err == nil {
				err = hw.Error()
			}
			if err != nil {
				return err
			}
			lso, err := adm.ListCommittedOffsets(ctx, topic)
			if err != nil {
				return err
			}
			ends = map[int32]int64{}
			var open []string
			hw.Each(func(o kadm.ListedOffset) {
				ends[o.Partition] = o.Offset
				if l, ok := lso.Lookup(topic, o.Partition); !ok || l.Offset != o.Offset {
					open = append(open, fmt.Sprintf("[%d] lso %d < end %d", o.Partition, l.Offset, o.Offset))
				}
			})
			if len(open) > 0 {
				return fmt.Errorf("open: %v", open)
			}
			return nil
		})
	})
	total := int64(0)
	for _, e := range ends {
		total += e
	}
	if total == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	next := map[int32]int64{}
	var got []*kgo.Record
	deadline := time.Now().Add(60 * time.Second)
	for {
		done := true
		for p, e := range ends {
			if next[p] < e {
				done = false
			}
		}
		if done {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("read %s: %d records, positions %v, ends %v after 60s", topic, len(got), next, ends)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			next[r.Partition] = r.Offset + 1
			if !r.Attrs.IsControl() {
				got = append(got, r)
			}
		})
	}
}

// srCollector reads topics from their start for the whole test, to poll on
// progress without re-reading.
type srCollector struct {
	mu   sync.Mutex
	recs map[string][]*kgo.Record
}

func srCollect(t *testing.T, seeds []string, topics ...string) *srCollector {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	c := &srCollector{recs: map[string][]*kgo.Record{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			c.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) { c.recs[r.Topic] = append(c.recs[r.Topic], r) })
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return c
}

func (c *srCollector) Records(topic string) []*kgo.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*kgo.Record(nil), c.recs[topic]...)
}

func (c *srCollector) Len(topic string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs[topic])
}

func srHdr(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// srRef is a record's place: topic/partition/offset, as rtproxy-source
// writes it.
func srRef(r *kgo.Record) string { return fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset) }

func srParseRef(ref string) (topic string, part int32, off int64, ok bool) {
	i := strings.LastIndexByte(ref, '/')
	if i < 0 {
		return "", 0, 0, false
	}
	j := strings.LastIndexByte(ref[:i], '/')
	if j < 0 {
		return "", 0, 0, false
	}
	p, err1 := strconv.ParseInt(ref[j+1:i], 10, 32)
	o, err2 := strconv.ParseInt(ref[i+1:], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, 0, false
	}
	return ref[:j], int32(p), o, true
}

// srSrc is one source record.
type srSrc struct {
	Ref string
	Rec *kgo.Record
	E   srEvent
}

// srSource reads and decodes the whole source topic.
func srSource(t *testing.T, seeds []string, topic string) map[string]srSrc {
	t.Helper()
	out := map[string]srSrc{}
	for _, r := range srRead(t, seeds, topic) {
		var e srEvent
		if err := json.Unmarshal(r.Value, &e); err != nil {
			t.Fatalf("source record %s: %v", r.Value, err)
		}
		out[srRef(r)] = srSrc{Ref: srRef(r), Rec: r, E: e}
	}
	return out
}

// --- expected results and checks -------------------------------------------

// srKept is the stateless route's expected output: the source records whose
// id is not a multiple of 5.
func srKept(src map[string]srSrc) map[string]srEvent {
	out := map[string]srEvent{}
	for ref, s := range src {
		if s.E.ID%5 != 0 {
			out[ref] = s.E
		}
	}
	return out
}

// srCoverage returns how many refs of want are missing from the outputs'
// rtproxy-source headers.
func srCoverage(outs []*kgo.Record, want map[string]srEvent) (missing int, example string) {
	seen := map[string]bool{}
	for _, r := range outs {
		seen[srHdr(r, "rtproxy-source")] = true
	}
	for ref := range want {
		if !seen[ref] {
			missing++
			if example == "" || ref < example {
				example = ref
			}
		}
	}
	return missing, example
}

// srCheckStateless checks the stateless route's sink: every output names a
// kept source record and carries its id with tag "kept", and the distinct
// rtproxy-source set is exactly the kept set. It returns the outputs per
// source record.
func srCheckStateless(t *testing.T, outs []*kgo.Record, kept map[string]srEvent) map[string]int {
	t.Helper()
	count := map[string]int{}
	bad := 0
	for _, r := range outs {
		ref := srHdr(r, "rtproxy-source")
		e, ok := kept[ref]
		var v map[string]any
		json.Unmarshal(r.Value, &v)
		if !ok || v["tag"] != "kept" || v["id"] != float64(e.ID) {
			if bad++; bad <= 5 {
				t.Errorf("stateless output %s (rtproxy-source %q) names no kept source record or differs from it (want id %d tagged kept)", r.Value, ref, e.ID)
			}
			continue
		}
		count[ref]++
	}
	if missing, ex := srCoverage(outs, kept); missing > 0 {
		t.Errorf("stateless sink: %d of %d kept records never output (e.g. %s)", missing, len(kept), ex)
	}
	return count
}

type srWinKey struct {
	User  string
	Start int64
}

func (w srWinKey) String() string { return fmt.Sprintf("%s@%d", w.User, w.Start) }

// srWantWindows recomputes every data window by brute force: count and sum
// of amount per (user, 1s tumbling window). Flush records are left out.
func srWantWindows(src map[string]srSrc) map[srWinKey]string {
	type agg struct{ n, total int }
	m := map[srWinKey]*agg{}
	for _, s := range src {
		if s.E.User == srFlushUser {
			continue
		}
		k := srWinKey{s.E.User, s.E.TS - s.E.TS%1000}
		if m[k] == nil {
			m[k] = &agg{}
		}
		m[k].n++
		m[k].total += s.E.Amount
	}
	out := map[srWinKey]string{}
	for k, a := range m {
		out[k] = fmt.Sprintf("n=%d total=%d", a.n, a.total)
	}
	return out
}

// srWindowRows decodes the window sink: every emission per window, as
// "n=.. total=..", in sink order per partition.
func srWindowRows(outs []*kgo.Record) (map[srWinKey][]string, []string) {
	sort.SliceStable(outs, func(i, j int) bool {
		if outs[i].Partition != outs[j].Partition {
			return outs[i].Partition < outs[j].Partition
		}
		return outs[i].Offset < outs[j].Offset
	})
	rows := map[srWinKey][]string{}
	var problems []string
	for _, r := range outs {
		var v struct {
			Key   string   `json:"key"`
			Start int64    `json:"window_start"`
			End   int64    `json:"window_end"`
			N     *float64 `json:"n"`
			Total *float64 `json:"total"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil || v.N == nil || v.Total == nil {
			problems = append(problems, fmt.Sprintf("window row %s: not a window row (%v)", r.Value, err))
			continue
		}
		if v.Key == srFlushUser {
			continue
		}
		if h, want := srHdr(r, "rtproxy-window"), fmt.Sprintf("%d-%d", v.Start, v.End); h != want {
			problems = append(problems, fmt.Sprintf("window row %s: rtproxy-window %q, want %q", r.Value, h, want))
		}
		k := srWinKey{v.Key, v.Start}
		rows[k] = append(rows[k], fmt.Sprintf("n=%d total=%d", int(*v.N), int(*v.Total)))
	}
	return rows, problems
}

// srWindowsMissing returns how many wanted windows have no row yet.
func srWindowsMissing(outs []*kgo.Record, want map[srWinKey]string) int {
	rows, _ := srWindowRows(outs)
	n := 0
	for k := range want {
		if len(rows[k]) == 0 {
			n++
		}
	}
	return n
}

// srCheckWindows compares every window row with the recomputation: each
// wanted window emitted, every emission of a window (a repeat included)
// equal to the recomputed one, no row for a window no record falls in.
// It returns the rows per window.
func srCheckWindows(t *testing.T, outs []*kgo.Record, want map[srWinKey]string) map[srWinKey][]string {
	t.Helper()
	rows, problems := srWindowRows(outs)
	srCompareRows(t, "window", rows, problems, want)
	return rows
}

// srCompareRows reports problems (at most five) and every difference
// between the rows read per window (or session) and the recomputed ones:
// a wanted one without a row, an emission (a repeat included) unlike the
// recomputation, a row for one the source does not hold. what names them
// in the messages.
func srCompareRows(t *testing.T, what string, rows map[srWinKey][]string, problems []string, want map[srWinKey]string) {
	t.Helper()
	for i, p := range problems {
		if i < 5 {
			t.Error(p)
		}
	}
	var bad []string
	for k, w := range want {
		if len(rows[k]) == 0 {
			bad = append(bad, fmt.Sprintf("%v: no row, want %s", k, w))
		}
		for i, got := range rows[k] {
			if got != w {
				bad = append(bad, fmt.Sprintf("%v: emission %d of %d is %s, want %s", k, i+1, len(rows[k]), got, w))
			}
		}
	}
	for k, rs := range rows {
		if _, ok := want[k]; !ok {
			bad = append(bad, fmt.Sprintf("%v: %d rows %v for a %s the source does not hold", k, len(rs), rs, what))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		t.Errorf("%d of %d %ss differ from the brute-force recomputation: %s", len(bad), len(want), what, strings.Join(bad[:min(len(bad), 8)], "; "))
	}
}

// srWantDedup is every dedup key of the source with the refs holding it.
func srWantDedup(src map[string]srSrc) map[string][]string {
	out := map[string][]string{}
	for ref, s := range src {
		out[s.E.DK] = append(out[s.E.DK], ref)
	}
	return out
}

// srDedupMissing returns how many dedup keys have no output yet.
func srDedupMissing(outs []*kgo.Record, want map[string][]string) int {
	seen := map[string]bool{}
	for _, r := range outs {
		var e srEvent
		if json.Unmarshal(r.Value, &e) == nil {
			seen[e.DK] = true
		}
	}
	n := 0
	for dk := range want {
		if !seen[dk] {
			n++
		}
	}
	return n
}

// srCheckDedup checks drop_duplicates exactly: each output names (by
// rtproxy-source) a source record and is that record's value; each dedup
// key of the source is passed by exactly one source record (a replay may
// repeat that record's output, never pass a second one). It returns the
// outputs per source record.
func srCheckDedup(t *testing.T, outs []*kgo.Record, src map[string]srSrc) map[string]int {
	t.Helper()
	count := map[string]int{}
	passed := map[string]map[string]bool{} // dk → refs that passed
	bad := 0
	for _, r := range outs {
		ref := srHdr(r, "rtproxy-source")
		s, ok := src[ref]
		if !ok || string(r.Value) != string(s.Rec.Value) {
			if bad++; bad <= 5 {
				t.Errorf("dedup output %s (rtproxy-source %q) is not the source record it names", r.Value, ref)
			}
			continue
		}
		count[ref]++
		if passed[s.E.DK] == nil {
			passed[s.E.DK] = map[string]bool{}
		}
		passed[s.E.DK][ref] = true
	}
	var twice, never []string
	for dk := range srWantDedup(src) {
		switch n := len(passed[dk]); {
		case n == 0:
			never = append(never, dk)
		case n > 1:
			var refs []string
			for ref := range passed[dk] {
				refs = append(refs, fmt.Sprintf("%s(id %d)", ref, src[ref].E.ID))
			}
			sort.Strings(refs)
			twice = append(twice, fmt.Sprintf("%s by %v", dk, refs))
		}
	}
	sort.Strings(twice)
	sort.Strings(never)
	if len(twice) > 0 {
		t.Errorf("drop_duplicates passed %d keys more than once: %s", len(twice), strings.Join(twice[:min(len(twice), 6)], "; "))
	}
	if len(never) > 0 {
		t.Errorf("drop_duplicates never passed %d keys: %v", len(never), never[:min(len(never), 10)])
	}
	return count
}

// srCheckNoDLQ fails on any dead letter (a late record means the watermark
// passed a record that had not been applied yet).
func srCheckNoDLQ(t *testing.T, seeds []string, topics ...string) {
	t.Helper()
	for _, tp := range topics {
		rs := srRead(t, seeds, tp)
		reasons := map[string]int{}
		for _, r := range rs {
			reasons[srHdr(r, "rtproxy-reason")]++
		}
		if len(rs) > 0 {
			t.Errorf("%s holds %d dead letters (by reason %v), want none; first: %s headers %v", tp, len(rs), reasons, rs[0].Value, rs[0].Headers)
		}
	}
}

// srRepeats counts the outputs beyond the first per key.
func srRepeats[K comparable](count map[K]int) int {
	n := 0
	for _, c := range count {
		if c > 1 {
			n += c - 1
		}
	}
	return n
}

// srNewRepeats lists the keys output more often in after than in before,
// beyond a first output: repeats that appeared between the two readings.
func srNewRepeats[K comparable](before, after map[K]int) []K {
	var out []K
	for k, c := range after {
		if c > max(before[k], 1) {
			out = append(out, k)
		}
	}
	return out
}

func srCountRows(rows map[srWinKey][]string) map[srWinKey]int {
	out := map[srWinKey]int{}
	for k, rs := range rows {
		out[k] = len(rs)
	}
	return out
}

// srCountBySource counts the outputs per rtproxy-source.
func srCountBySource(outs []*kgo.Record) map[string]int {
	out := map[string]int{}
	for _, r := range outs {
		out[srHdr(r, "rtproxy-source")]++
	}
	return out
}

// --- admin views of an instance --------------------------------------------

type srTP struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

func (tp srTP) String() string { return fmt.Sprintf("%s[%d]", tp.Topic, tp.Partition) }

// srRouteStatus is what the shared-routes tests read of one /routes entry.
type srRouteStatus struct {
	Name       string `json:"name"`
	State      string `json:"state"`
	Group      string `json:"group"`
	Generation int64  `json:"generation"`
	Owned      []srTP `json:"owned"`
	Assignment []struct {
		srTP
		Owner string `json:"owner"`
		Self  bool   `json:"self"`
	} `json:"assignment"`
	Restore *struct {
		State   string  `json:"state"`
		Records int64   `json:"records"`
		Seconds float64 `json:"seconds"`
	} `json:"restore"`
	LastError string `json:"last_error"`
}

var srHTTP = &http.Client{Timeout: 3 * time.Second}

// srRoutes reads /routes of a live instance without failing the test.
func srRoutes(p *Proxy) (map[string]srRouteStatus, error) {
	resp, err := srHTTP.Get(p.AdminURL + "/routes")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /routes: %s: %s", resp.Status, b)
	}
	var rs []srRouteStatus
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, fmt.Errorf("GET /routes: %v: %s", err, b)
	}
	out := map[string]srRouteStatus{}
	for _, r := range rs {
		out[r.Name] = r
	}
	return out, nil
}

// srMetrics reads /metrics of a live instance without failing the test.
func srMetrics(p *Proxy) (string, error) {
	resp, err := srHTTP.Get(p.AdminURL + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// srMetric sums the samples of metric name whose labels contain every one
// of labels (such as `route="x"`), and says whether any was found.
func srMetric(text, name string, labels ...string) (float64, bool) {
	sum, found := 0.0, false
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest == "" || (rest[0] != '{' && rest[0] != ' ')) {
			continue
		}
		all := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				all = false
			}
		}
		if !all {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

// srWaitOwned waits until the live instances procs divide every partition
// of topics (the route's source and repartition topics) between them: each
// owned by exactly one, each instance owning at least one, the same answer
// twice in a row. It returns what each instance owns.
func srWaitOwned(t *testing.T, r srRoute, topics map[string]int, procs []*Proxy, timeout time.Duration) [][]srTP {
	t.Helper()
	var owned [][]srTP
	prev := ""
	srWait(t, timeout, fmt.Sprintf("%s: %d instances share %v", r.Name, len(procs), topics), func() error {
		owned = make([][]srTP, len(procs))
		by := map[srTP]int{}
		for i, p := range procs {
			rs, err := srRoutes(p)
			if err != nil {
				return fmt.Errorf("instance %d: %v", i, err)
			}
			st, ok := rs[r.Name]
			if !ok {
				return fmt.Errorf("instance %d has no route %s", i, r.Name)
			}
			if st.Group != "" && st.Group != r.Group() {
				t.Fatalf("instance %d: route %s in group %q, want %q", i, r.Name, st.Group, r.Group())
			}
			if len(st.Owned) == 0 {
				return fmt.Errorf("instance %d owns nothing of %s (state %s, generation %d, error %q)", i, r.Name, st.State, st.Generation, st.LastError)
			}
			for _, tp := range st.Owned {
				if prevOwner, dup := by[tp]; dup {
					return fmt.Errorf("%v owned by instances %d and %d", tp, prevOwner, i)
				}
				by[tp] = i
			}
			owned[i] = append([]srTP(nil), st.Owned...)
			sort.Slice(owned[i], func(a, b int) bool {
				if owned[i][a].Topic != owned[i][b].Topic {
					return owned[i][a].Topic < owned[i][b].Topic
				}
				return owned[i][a].Partition < owned[i][b].Partition
			})
		}
		var missing []string
		for tp, n := range topics {
			for p := 0; p < n; p++ {
				if _, ok := by[srTP{tp, int32(p)}]; !ok {
					missing = append(missing, srTP{tp, int32(p)}.String())
				}
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			return fmt.Errorf("owned by no instance: %v (owned: %v)", missing, owned)
		}
		for tp := range by {
			if _, ok := topics[tp.Topic]; !ok {
				return fmt.Errorf("%v is owned but is not a topic of the group %v", tp, topics)
			}
		}
		cur := fmt.Sprint(owned)
		if cur != prev {
			prev = cur
			return errors.New("assignment changed since the last look: " + cur)
		}
		return nil
	})
	return owned
}

// srOwnedOf filters owned to one topic's partitions.
func srOwnedOf(owned []srTP, topic string) []int32 {
	var out []int32
	for _, tp := range owned {
		if tp.Topic == topic {
			out = append(out, tp.Partition)
		}
	}
	return out
}

// srCheckWindowRowsOnly decodes window rows, reporting malformed ones.
func srCheckWindowRowsOnly(t *testing.T, outs []*kgo.Record) map[srWinKey][]string {
	t.Helper()
	rows, problems := srWindowRows(outs)
	for i, p := range problems {
		if i < 5 {
			t.Error(p)
		}
	}
	return rows
}

// srChangelogSummary describes the route's changelog topics for a failure
// message: per topic, the records per partition and per key tag (the first
// byte of the key: 'k' keyed state, 's' snapshot, 'i' inbox, 'j' journal,
// 'r' fence, per pipeline/changelog.go).
func srChangelogSummary(t *testing.T, seeds []string, r srRoute) string {
	t.Helper()
	cls, err := srTopicsLike(seeds, r.Name+".", ".changelog")
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, tp := range srTopicNames(cls) {
		tags := map[string]int{}
		parts := map[int32]int{}
		for _, rec := range srRead(t, seeds, tp) {
			tag := "none"
			if len(rec.Key) > 0 {
				tag = string(rec.Key[:1])
			}
			tags[tag]++
			parts[rec.Partition]++
		}
		out = append(out, fmt.Sprintf("%s: records per partition %v, per key tag %v", tp, parts, tags))
	}
	if len(out) == 0 {
		return "no changelog topic " + r.Name + ".<NN>-<kind>.changelog"
	}
	return strings.Join(out, "; ")
}
