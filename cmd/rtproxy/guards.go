package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/protocol"
	"github.com/rtproxy/rtproxy/rules"
)

// guards binds the guard rule files (rules.Guard) to the proxy
// (protocol.Guards): every rule set the watcher applies replaces the set in
// force, so guards reload like routes.
type guards struct {
	log      *slog.Logger
	rejected *prometheus.CounterVec // guard, check
	sink     *guardSink
	set      func(protocol.Guards)
	// unavailable counts partitions refused (retriably) because a
	// registry-format guard's schema registry did not answer.
	unavailable *prometheus.CounterVec // guard
	sr          serde.Config           // the proxy's schema registry
	regs        registries             // registry clients of format avro | protobuf guards
	// closed names the guards in force that fail closed (rules.Guard.Closed):
	// their files do not load and have no valid version. While one is,
	// the proxy is not ready (notReady).
	closed atomic.Pointer[[]string]
}

func newGuards(log *slog.Logger, reg prometheus.Registerer, seeds []string, opts []kgo.Opt, sr serde.Config, set func(protocol.Guards)) (*guards, error) {
	g := &guards{log: log, set: set, sink: &guardSink{seeds: seeds, opts: opts, log: log}, sr: sr,
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_guard_rejected_records_total",
			Help: "Produced records a guard refused, by guard and the check they failed (their batch-mates are refused with them, not counted).",
		}, []string{"guard", "check"}),
		unavailable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_guard_registry_unavailable_total",
			Help: "Produced partitions a guard with format avro or protobuf refused with a retriable error because the schema registry did not answer in time.",
		}, []string{"guard"})}
	for _, c := range []prometheus.Collector{g.rejected, g.unavailable} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("guard metrics: %w", err)
		}
	}
	return g, nil
}

// apply puts the guard files of a rule set in force (none: the produce path
// is untouched again).
func (g *guards) apply(files []*rules.Route) {
	var closed []string
	for _, f := range files {
		if f.Guard.Closed != "" {
			closed = append(closed, f.Name)
			g.log.Error("guard fails closed: its file does not load and has no valid version; produce to its topics is refused and the proxy is not ready until the file is fixed",
				"guard", f.Name, "file", f.File, "topic", f.Guard.Topic)
		}
	}
	g.closed.Store(&closed)
	defer g.regs.prune()
	if len(files) == 0 {
		g.set(nil)
		return
	}
	s := &guardSet{}
	for _, f := range files {
		o := &guardOf{name: f.Name, g: f.Guard, gs: g}
		if f.Guard.Closed == "" && f.Guard.Format.Registry() {
			o.dec = g.newGuardDecoder(f, g.sr)
		}
		s.all = append(s.all, o)
	}
	g.set(s)
}

// notReady says why the proxy is not ready because of guards: one fails
// closed. "" when none does.
func (g *guards) notReady() string {
	p := g.closed.Load()
	if p == nil || len(*p) == 0 {
		return ""
	}
	return fmt.Sprintf("guard %s does not load (no valid version to keep): produce to its topics is refused until its file is fixed; see /routes", strings.Join(*p, ", "))
}

func (g *guards) close() { g.sink.close() }

// guardSet is the guards in force, in rule-file order.
type guardSet struct{ all []*guardOf }

// For returns the guards matching topic, checked in file order.
func (s *guardSet) For(topic string) protocol.Guard {
	var m guardList
	for _, g := range s.all {
		if g.g.Matches(topic) {
			m = append(m, g)
		}
	}
	switch len(m) {
	case 0:
		return nil
	case 1:
		return m[0]
	}
	return m
}

// guardOf is one guard file in force.
type guardOf struct {
	name string
	g    *rules.Guard
	gs   *guards
	dec  *guardDecoder // format avro | protobuf (guardformat.go)
}

// Check is CheckRetriable (guardformat.go) for callers that cannot retry.
func (o *guardOf) Check(topic string, partition int32, rec *protocol.ProducedRecord) (string, string, bool) {
	check, msg, ok, _ := o.CheckRetriable(topic, partition, rec)
	return check, msg, ok
}

func (o *guardOf) Refused(r protocol.Refusal) {
	if r.Retriable() {
		// The producer retries these records: no dead letters.
		o.gs.unavailable.WithLabelValues(o.name).Inc()
		o.gs.log.Warn("guard could not check produced records: schema registry unavailable; refused with a retriable error",
			"guard", o.name, "topic", r.Topic, "partition", r.Partition, "err", r.Failures[0].Message)
		return
	}
	for _, f := range r.Failures {
		_, check := splitCheck(f.Check)
		o.gs.rejected.WithLabelValues(o.name, check).Inc()
	}
	if r.Err != nil {
		o.gs.rejected.WithLabelValues(o.name, "decode").Inc()
	}
	o.gs.log.Debug("guard refused produced records", "guard", o.name, "topic", r.Topic, "partition", r.Partition,
		"records", len(r.Records), "failed", len(r.Failures))
	if o.g.OnReject == rules.GuardDeadLetter {
		o.gs.sink.deadLetters(o.g.DeadLetter, r)
	}
}

// guardList is several guards on one topic: each record must pass all.
type guardList []*guardOf

func (l guardList) Check(topic string, partition int32, rec *protocol.ProducedRecord) (string, string, bool) {
	check, msg, ok, _ := l.CheckRetriable(topic, partition, rec)
	return check, msg, ok
}

// Refused goes to the guard whose check failed first for the batch's first
// failing record (each failure names its guard).
func (l guardList) Refused(r protocol.Refusal) {
	by := map[string][]protocol.RecordFailure{}
	for _, f := range r.Failures {
		name, _ := splitCheck(f.Check)
		by[name] = append(by[name], f)
	}
	for _, g := range l {
		if fs, ok := by[g.name]; ok || (r.Err != nil && g == l[0]) {
			rr := r
			rr.Failures = fs
			g.Refused(rr)
		}
	}
}

// splitCheck splits "guard/check".
func splitCheck(s string) (guard, check string) {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return s[:i], s[i+1:]
		}
	}
	return "", s
}

// guardSink writes the refused records of guards with on_reject:
// dead_letter. Its client is made at the first dead letter.
type guardSink struct {
	seeds []string
	opts  []kgo.Opt
	log   *slog.Logger

	once sync.Once
	cl   *kgo.Client
	err  error
}

// deadLetters copies a refusal's records to topic, each with why it was
// refused. It never blocks the produce path: the writes are asynchronous,
// and a failure is logged.
func (s *guardSink) deadLetters(topic string, r protocol.Refusal) {
	s.once.Do(func() {
		s.cl, s.err = kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.seeds...), kgo.ProducerLinger(0),
			kgo.RecordDeliveryTimeout(30 * time.Second), kgo.AllowAutoTopicCreation()}, s.opts...)...)
	})
	if s.err != nil {
		s.log.Error("guard dead letters not written: no client", "err", s.err)
		return
	}
	failed := map[int]protocol.RecordFailure{}
	for _, f := range r.Failures {
		failed[f.Index] = f
	}
	first := protocol.RecordFailure{}
	if len(r.Failures) > 0 {
		first = r.Failures[0]
	}
	for i, rec := range r.Records {
		guard, check := splitCheck(first.Check)
		msg := fmt.Sprintf("refused with its batch: record %d failed check %s", first.Index, check)
		if f, ok := failed[i]; ok {
			guard, check = splitCheck(f.Check)
			msg = f.Message
		}
		// Copies: the refused records alias the request's buffer, which the
		// proxy reuses once Refused returns, while this write is async.
		hs := recordHeaders(rec)
		hs = append(hs,
			kgo.RecordHeader{Key: "rtproxy-guard", Value: []byte(guard)},
			kgo.RecordHeader{Key: "rtproxy-check", Value: []byte(check)},
			kgo.RecordHeader{Key: "rtproxy-error", Value: []byte(msg)},
			kgo.RecordHeader{Key: "rtproxy-target", Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: "rtproxy-partition", Value: []byte(strconv.Itoa(int(r.Partition)))},
		)
		kr := &kgo.Record{Topic: topic, Key: bytes.Clone(rec.Key), Value: bytes.Clone(rec.Value), Headers: hs,
			Timestamp: time.UnixMilli(rec.Timestamp)}
		s.cl.Produce(context.Background(), kr, func(_ *kgo.Record, err error) {
			if err != nil {
				s.log.Error("guard dead letter not written", "topic", topic, "err", err)
			}
		})
	}
}

func recordHeaders(r protocol.ProducedRecord) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, len(r.Headers), len(r.Headers)+5)
	for i, h := range r.Headers {
		out[i] = kgo.RecordHeader{Key: strings.Clone(h.Key), Value: bytes.Clone(h.Value)}
	}
	return out
}

func (s *guardSink) close() {
	s.once.Do(func() {}) // no client from now on
	if s.cl != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.cl.Flush(ctx)
		s.cl.Close()
	}
}
