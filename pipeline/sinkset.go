package pipeline

// The route's sinks: one outlet per sink of the route (its `sink:`, or
// one per branch of its `switch` step), and the sink set that is the
// route's sink behind the seam of writer.go. An output carries the outlet
// the switch chose (operators.Record.Branch; 0 without a switch), and the
// set hands it to that outlet's sink: a topic written through the route's
// writer, so at least once or in the checkpoint's one transaction with
// every other Kafka sink of the route, or a sink of its own kind (HTTP).
// Nothing else knows how many sinks a route has: the outbox counts each
// output in its epoch whatever sink carries it, so a checkpoint waits on
// every sink.

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/rules"
)

// outlet is one sink of the route with what its outputs are made with:
// its spec (key, format), its sink, and its counters.
type outlet struct {
	idx  int
	spec rules.Sink
	snk  sink
	// out counts outputs the sink acknowledged; errs outputs that failed
	// on it: a write it failed (retried or refused) or a value its format
	// could not encode. n* are the same, for /routes.
	out, errs   prometheus.Counter
	nOut, nErrs atomic.Int64
}

func (o *outlet) acked() {
	o.out.Inc()
	o.nOut.Add(1)
}

func (o *outlet) failed() {
	o.errs.Inc()
	o.nErrs.Add(1)
}

// sinkSet is the route's sink: its outlets, each output put to the
// outlet's sink it was made for, anything else sent by target.
type sinkSet struct {
	outs     []*outlet
	byTarget map[string]sink
}

func (s *sinkSet) put(o *outRecord) { o.w.to.snk.put(o) }

// send writes kr to the sink whose target is kr.Topic (the first sink when
// none is).
func (s *sinkSet) send(kr *kgo.Record, cb func(*kgo.Record, error)) { s.of(kr).send(kr, cb) }

func (s *sinkSet) retry(got *kgo.Record, cb func(*kgo.Record, error), err error) bool {
	return s.of(got).retry(got, cb, err)
}

func (s *sinkSet) of(kr *kgo.Record) sink {
	if k, ok := s.byTarget[kr.Topic]; ok {
		return k
	}
	return s.outs[0].snk
}

// target names every sink, comma separated.
func (s *sinkSet) target() string {
	t := make([]string, len(s.outs))
	for i, o := range s.outs {
		t[i] = o.snk.target()
	}
	return strings.Join(t, ", ")
}

func (s *sinkSet) close() {
	for _, o := range s.outs {
		if o.snk != nil {
			o.snk.close()
		}
	}
}

// isOutputTopic reports whether topic is where a sink of the set writes.
func (s *sinkSet) isOutputTopic(topic string) bool {
	_, ok := s.byTarget[topic]
	return ok
}

// newOutlets are the route's outlets, made once with the route (their
// counters live as long as it); each setup gives them their sinks
// (newSinkSet).
func (r *route) newOutlets() []*outlet {
	specs := r.def.Sinks()
	outs := make([]*outlet, len(specs))
	for i := range specs {
		name := sinkLabel(&specs[i])
		outs[i] = &outlet{idx: i, spec: specs[i],
			out:  r.m.met.sinkOut.WithLabelValues(r.name, name),
			errs: r.m.met.sinkWriteErrors.WithLabelValues(r.name, name)}
	}
	return outs
}

// newSinkSet gives each outlet its sink, the first kind of its own that
// takes its spec (sinkKinds), else its topic through the route's writer,
// and returns the set of them. mk, when set, builds every sink instead
// (the Driver's are memory).
func (r *route) newSinkSet(mk func(spec *rules.Sink) sink) (*sinkSet, error) {
	s := &sinkSet{outs: r.outs, byTarget: make(map[string]sink, len(r.outs))}
	for _, o := range r.outs {
		o.snk = nil
	}
	for _, o := range r.outs {
		spec := &o.spec
		var k sink
		if mk != nil {
			k = mk(spec)
		} else {
			for _, kind := range sinkKinds {
				kk, ok, err := kind(r, spec)
				if !ok {
					continue
				}
				if err != nil {
					s.close()
					return nil, err
				}
				k = kk
				break
			}
			if k == nil {
				k = topicSink{w: r.wr, topic: spec.Topic}
			}
		}
		o.snk = k
		s.byTarget[k.target()] = k
	}
	return s, nil
}

// sinkLabel is a sink's `sink` label: rules.Sink.Name, its topic when a
// definition made by hand has none.
func sinkLabel(s *rules.Sink) string {
	if s.Name != "" {
		return s.Name
	}
	if s.Topic != "" {
		return s.Topic
	}
	return "http"
}

// outletOf is the outlet an output goes to: the branch the switch chose,
// nil when there is no such branch.
func (r *route) outletOf(branch int) *outlet {
	if branch < 0 || branch >= len(r.outs) {
		return nil
	}
	return r.outs[branch]
}

// SinkStatus is one sink of a route on /routes: its name (the metrics'
// `sink` label), where it writes, its format, and its counts since the
// route started.
type SinkStatus struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Format string `json:"format,omitempty"`
	// Out are outputs the sink acknowledged; Errors outputs that failed on
	// it (a write retried or refused, a value that did not encode).
	Out    int64 `json:"records_out"`
	Errors int64 `json:"errors"`
}

func (r *route) sinkStatus() []SinkStatus {
	out := make([]SinkStatus, 0, len(r.outs))
	for _, o := range r.outs {
		out = append(out, SinkStatus{Name: sinkLabel(&o.spec), Target: o.spec.Target(), Format: string(o.spec.Format),
			Out: o.nOut.Load(), Errors: o.nErrs.Load()})
	}
	return out
}

// sinkText is what /routes shows as a route's sink: its target, or its
// switch's targets, comma separated.
func sinkText(d *rules.Route) string {
	if d.Switch == nil {
		return d.Sink.Target()
	}
	t := make([]string, len(d.Switch))
	for i, b := range d.Switch {
		t[i] = b.Sink.Target()
	}
	return strings.Join(t, ", ")
}

// goneSinks are the `sink` labels of was that now does not have: the
// sinks a new version of a route no longer writes to (a switch branch
// removed, a switch become a single sink), whose series go once the old
// version has stopped.
func goneSinks(was, now *rules.Route) []string {
	keep := map[string]bool{}
	for _, s := range now.Sinks() {
		keep[sinkLabel(&s)] = true
	}
	var gone []string
	for _, s := range was.Sinks() {
		if l := sinkLabel(&s); !keep[l] {
			keep[l] = true // once, when two sinks share a label
			gone = append(gone, l)
		}
	}
	return gone
}
