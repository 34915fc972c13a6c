package main

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func (e *env) client(opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.addrs...), kgo.ProducerLinger(0)}, opts...)...)
	check(err)
	return cl
}

func (e *env) createTopics(names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := e.adm.CreateTopics(ctx, int32(*partitions), -1, nil, names...)
	check(err)
	check(resp.Error())
}

// deleteTopics deletes names and every topic of the named routes
// (<route>.*: repartition and changelog topics), so kfake's memory does
// not grow phase after phase.
func (e *env) deleteTopics(routes []string, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, r := range routes {
		names = append(names, e.internalTopics(r)...)
	}
	if _, err := e.adm.DeleteTopics(ctx, names...); err != nil {
		log.Printf("delete topics: %v", err)
	}
}

// internalTopics lists the topics rtproxy made for route: those named
// <route>.<something>.repartition or .changelog.
func (e *env) internalTopics(route string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := e.adm.ListTopics(ctx)
	if err != nil {
		return nil
	}
	var out []string
	for _, t := range td.Names() {
		if strings.HasPrefix(t, route+".") && (strings.HasSuffix(t, ".repartition") || strings.HasSuffix(t, ".changelog")) {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}

func (e *env) topicsWithSuffix(route, suffix string) []string {
	var out []string
	for _, t := range e.internalTopics(route) {
		if strings.HasSuffix(t, suffix) {
			out = append(out, t)
		}
	}
	return out
}

// endOffsets sums the end offsets of topic's partitions (its record count
// when nothing was deleted).
func (e *env) endOffsets(topic string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lo, err := e.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return -1
	}
	var n int64
	lo.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			n += o.Offset
		}
	})
	return n
}

// groupView is what the benchmark needs of a consumer group: who is in it
// and which partitions each member holds.
type groupView struct {
	protocol string // "consumer" (KIP-848) or "classic"
	state    string
	members  []map[string][]int32 // per member: topic → partitions
	pending  bool                 // KIP-848: some member's assignment differs from its target
}

func (g groupView) String() string {
	var ms []string
	for _, m := range g.members {
		n := 0
		for _, ps := range m {
			n += len(ps)
		}
		ms = append(ms, strconv.Itoa(n))
	}
	return fmt.Sprintf("%s/%s members=%d partitions per member=[%s] pending=%v", g.protocol, g.state, len(g.members), strings.Join(ms, " "), g.pending)
}

// describeGroup describes group with the KIP-848 API, or the classic one.
func (e *env) describeGroup(group string) (groupView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// ConsumerGroupDescribe names assigned topics by id (kfake leaves the
	// names empty, and kadm keys its sets by name), so resolve ids here.
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	if resp, err := req.RequestWith(ctx, e.cl); err == nil && len(resp.Groups) == 1 {
		d := resp.Groups[0]
		if d.ErrorCode == 0 && len(d.Members) > 0 {
			names := map[[16]byte]string{}
			if tds, err := e.adm.ListTopics(ctx); err == nil {
				for _, td := range tds {
					names[td.ID] = td.Topic
				}
			}
			set := func(tps []kmsg.AssignmentTopicPartition) map[string][]int32 {
				out := map[string][]int32{}
				for _, tp := range tps {
					name := tp.Topic
					if name == "" {
						name = names[tp.TopicID]
					}
					out[name] = append(out[name], tp.Partitions...)
				}
				return out
			}
			v := groupView{protocol: "consumer", state: d.State}
			for _, m := range d.Members {
				a, t := set(m.Assignment.TopicPartitions), set(m.TargetAssignment.TopicPartitions)
				v.members = append(v.members, a)
				if fmt.Sprint(tpMap(a).sorted()) != fmt.Sprint(tpMap(t).sorted()) {
					v.pending = true
				}
			}
			return v, nil
		}
	}
	dg, err := e.adm.DescribeGroups(ctx, group)
	if err != nil {
		return groupView{}, err
	}
	d, ok := dg[group]
	if !ok {
		return groupView{}, fmt.Errorf("group %s not described", group)
	}
	if d.Err != nil {
		return groupView{}, d.Err
	}
	v := groupView{protocol: "classic", state: d.State}
	for _, m := range d.Members {
		a := map[string][]int32{}
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range c.Topics {
				a[t.Topic] = append(a[t.Topic], t.Partitions...)
			}
		}
		v.members = append(v.members, a)
	}
	return v, nil
}

type tpMap map[string][]int32

func (m tpMap) sorted() []string {
	var out []string
	for t, ps := range m {
		ps = slices.Clone(ps)
		slices.Sort(ps)
		out = append(out, fmt.Sprint(t, ps))
	}
	sort.Strings(out)
	return out
}

// waitGroup waits until route's group (rtproxy.<route>) has n members, every
// member holds at least one partition, and the members together hold every
// partition of the source and of each repartition topic, twice in a row
// 500ms apart. It returns how long that took and the last view; it does not
// fail, because code without groups (before issue 9) must still run.
func (e *env) waitGroup(route, source string, n int, timeout time.Duration) (time.Duration, groupView, bool) {
	group := "rtproxy." + route
	start := time.Now()
	var last groupView
	var lastErr error
	okTimes := 0
	for time.Since(start) < timeout {
		v, err := e.describeGroup(group)
		last, lastErr = v, err
		if err == nil && len(v.members) == n && !v.pending && v.covers(e, append([]string{source}, e.topicsWithSuffix(route, ".repartition")...)) {
			okTimes++
			if okTimes == 2 {
				return time.Since(start), v, true
			}
		} else {
			okTimes = 0
			if *verbose {
				log.Printf("group %s: %v (err %v)", group, v, err)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	log.Printf("group %s not settled on %d members after %v: %v (err %v); going on", group, n, timeout, last, lastErr)
	return time.Since(start), last, false
}

func (v groupView) covers(e *env, topics []string) bool {
	for _, m := range v.members {
		if len(m) == 0 {
			return false
		}
	}
	for _, t := range topics {
		want := e.partitionCount(t)
		got := map[int32]bool{}
		for _, m := range v.members {
			for _, p := range m[t] {
				got[p] = true
			}
		}
		if want <= 0 || len(got) != want {
			return false
		}
	}
	return true
}

func (e *env) partitionCount(topic string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	td, err := e.adm.ListTopics(ctx, topic)
	if err != nil {
		return -1
	}
	d, ok := td[topic]
	if !ok || d.Err != nil {
		return -1
	}
	return len(d.Partitions)
}

// committedCaughtUp reports whether the group's committed offsets equal the
// end offsets of every topic it consumes that starts with prefixTopics
// (the source and the route's repartition topics).
func (e *env) committedCaughtUp(route string, topics []string) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	group := "rtproxy." + route
	offs, err := e.adm.FetchOffsets(ctx, group)
	if err != nil {
		return false, err.Error()
	}
	ends, err := e.adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return false, err.Error()
	}
	var committed, end int64
	ok := true
	ends.Each(func(o kadm.ListedOffset) {
		end += o.Offset
		c, found := offs.Lookup(o.Topic, o.Partition)
		if !found || c.Err != nil {
			if o.Offset > 0 {
				ok = false
			}
			return
		}
		committed += c.At
		if c.At < o.Offset {
			ok = false
		}
	})
	return ok, fmt.Sprintf("committed %d of %d", committed, end)
}

// record makes one source record of size bytes: JSON with an id, a user
// (100 of them), an amount, the producer's send time, and padding.
func record(topic string, id int64, sendNS int64, size int) *kgo.Record {
	v := fmt.Appendf(make([]byte, 0, size), `{"id":%d,"user":"u%d","merchant":"m%d","amount":%d.5,"send_ns":%d,"pad":"`,
		id, id%100, id%120, id%1000, sendNS)
	for len(v) < size-2 {
		v = append(v, 'x')
	}
	v = append(v, '"', '}')
	return &kgo.Record{Topic: topic, Key: strconv.AppendInt(nil, id, 10), Value: v}
}

// produceAt sends records with ids from, from+1, ... to topic at rate per
// second for d, and returns how many it sent (all acknowledged).
func (e *env) produceAt(topic string, from int64, rate int, d time.Duration) int64 {
	prod := e.client(kgo.MaxBufferedRecords(1 << 16))
	defer prod.Close()
	var errs atomic.Int64
	end := time.Now().Add(d)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	perMs := float64(rate) / 1000
	owed := 0.0
	id := from
	for now := range tick.C {
		if now.After(end) {
			break
		}
		owed += perMs
		for ; owed >= 1; owed-- {
			prod.Produce(context.Background(), record(topic, id, time.Now().UnixNano(), *size), func(_ *kgo.Record, err error) {
				if err != nil {
					errs.Add(1)
				}
			})
			id++
		}
	}
	check(prod.Flush(context.Background()))
	if n := errs.Load(); n > 0 {
		log.Fatalf("produce %s: %d records failed", topic, n)
	}
	return id - from
}

// produceBulk sends ids [from, to) as fast as kfake takes them, small
// records ({"id":N,"send_ns":T}).
func (e *env) produceBulk(topic string, from, to int64) {
	prod := e.client(kgo.MaxBufferedRecords(1<<17), kgo.ProducerBatchMaxBytes(1<<20), kgo.ProducerLinger(5*time.Millisecond))
	defer prod.Close()
	var errs atomic.Int64
	for id := from; id < to; id++ {
		v := fmt.Appendf(nil, `{"id":%d,"send_ns":%d}`, id, time.Now().UnixNano())
		prod.Produce(context.Background(), &kgo.Record{Topic: topic, Key: strconv.AppendInt(nil, id, 10), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				errs.Add(1)
			}
		})
	}
	check(prod.Flush(context.Background()))
	if n := errs.Load(); n > 0 {
		log.Fatalf("produce %s: %d records failed", topic, n)
	}
}

// sinkKind says how a sink's outputs are identified.
type sinkKind int

const (
	byID     sinkKind = iota // one output per input, identified by value.id
	byWindow                 // window rows (emit on_update): one per input, identified by key, window_start, n
)

type winKey struct {
	key string
	ws  int64
	n   int64
}

type winGroup struct {
	key string
	ws  int64
}

type sample struct{ send, lat int64 }

// sinkReader reads a sink from its start and keeps, per output, its end to
// end latency (receipt − send_ns) and whether it was seen before.
type sinkReader struct {
	kind   sinkKind
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	total    int64
	unparsed int64
	samples  []sample
	ids      map[int64]int32 // outputs per id
	rows     map[winKey]struct{}
	maxN     map[winGroup]int64
	last     time.Time
}

func (e *env) readSink(topic string, kind sinkKind) *sinkReader {
	s := &sinkReader{kind: kind, ids: map[int64]int32{}, rows: map[winKey]struct{}{}, maxN: map[winGroup]int64{},
		done: make(chan struct{}), last: time.Now()}
	s.cl = e.client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(10*time.Millisecond), kgo.FetchMinBytes(1))
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		for {
			fs := s.cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			now := time.Now()
			s.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) { s.add(r.Value, now.UnixNano()) })
			if !fs.Empty() {
				s.last = now
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sinkReader) add(v []byte, now int64) {
	s.total++
	send, ok := numField(v, `"send_ns":`)
	if !ok {
		s.unparsed++
		return
	}
	s.samples = append(s.samples, sample{send, now - send})
	switch s.kind {
	case byID:
		id, ok := numField(v, `"id":`)
		if !ok {
			s.unparsed++
			return
		}
		s.ids[id]++
	case byWindow:
		k, ok1 := strField(v, `"key":`)
		ws, ok2 := numField(v, `"window_start":`)
		n, ok3 := numField(v, `"n":`)
		if !ok1 || !ok2 || !ok3 {
			s.unparsed++
			return
		}
		s.rows[winKey{k, ws, n}] = struct{}{}
		g := winGroup{k, ws}
		if n > s.maxN[g] {
			s.maxN[g] = n
		}
	}
}

// distinct is the number of different outputs seen.
func (s *sinkReader) distinct() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.distinctLocked()
}

func (s *sinkReader) distinctLocked() int64 {
	if s.kind == byWindow {
		return int64(len(s.rows))
	}
	return int64(len(s.ids))
}

// waitFor waits until want distinct outputs arrived, or nothing arrived for
// quiet, or max passed.
func (s *sinkReader) waitFor(want int64, quiet, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		d, last := s.distinctLocked(), s.last
		s.mu.Unlock()
		if d >= want || time.Since(last) > quiet {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *sinkReader) close() {
	s.cancel()
	<-s.done
	s.cl.Close()
}

// result is a sink's counts and the latencies of the outputs whose send time
// is in [from, to).
type result struct {
	total, distinct, dups, unparsed int64
	finalCountSum                   int64 // window: sum over (key, window) of the last n
	lats                            []time.Duration
}

func (s *sinkReader) result(from, to int64) result {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := result{total: s.total, distinct: s.distinctLocked(), unparsed: s.unparsed}
	r.dups = r.total - r.distinct - r.unparsed
	for _, n := range s.maxN {
		r.finalCountSum += n
	}
	for _, x := range s.samples {
		if x.send >= from && x.send < to {
			r.lats = append(r.lats, time.Duration(x.lat))
		}
	}
	slices.Sort(r.lats)
	return r
}

func (r result) q(p float64) time.Duration {
	if len(r.lats) == 0 {
		return 0
	}
	return r.lats[min(int(p*float64(len(r.lats))), len(r.lats)-1)]
}

// numField reads the number after name (`"id":`) in a compact JSON value
// without decoding all of it; window rows may write it as a float
// (1.7e+18).
func numField(v []byte, name string) (int64, bool) {
	i := bytes.Index(v, []byte(name))
	if i < 0 {
		return 0, false
	}
	s := v[i+len(name):]
	j := 0
	for j < len(s) && (s[j] == '-' || s[j] == '.' || s[j] == 'e' || s[j] == 'E' || s[j] == '+' || (s[j] >= '0' && s[j] <= '9')) {
		j++
	}
	if n, err := strconv.ParseInt(string(s[:j]), 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(string(s[:j]), 64)
	if err != nil {
		return 0, false
	}
	return int64(f), true
}

func strField(v []byte, name string) (string, bool) {
	i := bytes.Index(v, []byte(name))
	if i < 0 {
		return "", false
	}
	s := v[i+len(name):]
	if len(s) == 0 || s[0] != '"' {
		return "", false
	}
	j := bytes.IndexByte(s[1:], '"')
	if j < 0 {
		return "", false
	}
	return string(s[1 : 1+j]), true
}
