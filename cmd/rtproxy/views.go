package main

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/protocol"
	"github.com/rtproxy/rtproxy/rules"
)

// views binds the view rule files (rules.View) to the proxy's fetch path
// (protocol.Views): every rule set the watcher applies replaces the set in
// force, so views reload like routes and guards. Each view counts the
// records it processed, filtered out and could not process, for /routes
// and the status page (Status). /metrics has the proxy's count of the same
// records, rtproxy_proxy_view_records_total{view,outcome} (protocol), which
// also counts batches that did not decode and so never reached a view.
type views struct {
	log *slog.Logger
	// set puts a set in force on the proxy; nil when the proxy has no
	// fetch path for views (then views load, check and count nothing).
	set func(protocol.Views)

	mu       sync.Mutex
	counters map[string]*viewCounters // by view name; kept across reloads
	cur      atomic.Pointer[viewSet]
}

// viewCounters are one view's counts, for Status.
type viewCounters struct {
	records, filtered, errors atomic.Int64
}

func newViews(log *slog.Logger, set func(protocol.Views)) (*views, error) {
	v := &views{log: log, set: set, counters: map[string]*viewCounters{}}
	return v, nil
}

// viewsSetter is the proxy's SetViews, when it has one.
func viewsSetter(px any) func(protocol.Views) {
	if s, ok := px.(interface{ SetViews(protocol.Views) }); ok {
		return s.SetViews
	}
	return nil
}

func (v *views) countersOf(name string) *viewCounters {
	v.mu.Lock()
	defer v.mu.Unlock()
	c := v.counters[name]
	if c == nil {
		c = &viewCounters{}
		v.counters[name] = c
	}
	return c
}

// apply puts the view files of a rule set in force (none: every fetch is
// served as stored again).
func (v *views) apply(files []*rules.Route) {
	s := &viewSet{byName: map[string]*viewOf{}}
	names := map[string]bool{}
	for _, f := range files {
		if f.View.Closed != "" {
			v.log.Error("view fails closed: its file does not load and has no valid version; its records are withheld from every client until the file is fixed",
				"view", f.Name, "file", f.File, "topic", f.View.Topic)
		}
		o := &viewOf{route: f, v: f.View, c: v.countersOf(f.Name)}
		s.byName[f.Name] = o
		s.all = append(s.all, o)
		names[f.Name] = true
	}
	sort.Slice(s.all, func(i, j int) bool { return s.all[i].route.Name < s.all[j].route.Name })
	v.mu.Lock()
	for name := range v.counters {
		if !names[name] {
			// A view removed: a view of that name later starts from zero.
			delete(v.counters, name)
		}
	}
	v.mu.Unlock()
	v.cur.Store(s)
	if v.set == nil {
		if len(files) > 0 {
			v.log.Warn("view files loaded, but this proxy has no fetch path for views; clients fetch topics as stored", "views", len(files))
		}
		return
	}
	if len(files) == 0 {
		v.set(nil)
		return
	}
	v.set(s)
}

// notReady says why the proxy is not ready because of views: one fails
// closed (its file does not load), so its clients get placeholders only.
// "" when none does.
func (v *views) notReady() string {
	s := v.cur.Load()
	if s == nil {
		return ""
	}
	var closed []string
	for _, o := range s.all {
		if o.v.Closed != "" {
			closed = append(closed, o.route.Name)
		}
	}
	if len(closed) == 0 {
		return ""
	}
	return fmt.Sprintf("view %s does not load (no valid version to keep): its records are withheld from every client until its file is fixed; see /routes", strings.Join(closed, ", "))
}

// viewStatus is one view as /routes and the status page show it.
type viewStatus struct {
	Kind     string `json:"kind"` // "view", to tell views from routes in /routes
	Name     string `json:"name"`
	File     string `json:"file"`
	Topic    string `json:"topic"`
	InPlace  bool   `json:"in_place"`
	Clients  string `json:"clients"`
	Steps    int    `json:"steps"`
	State    string `json:"state"` // running, or closed (its file does not load: every record withheld)
	Closed   string `json:"closed,omitempty"`
	Records  int64  `json:"records"`
	Filtered int64  `json:"filtered"`
	Errors   int64  `json:"errors"`
}

// Status lists the views in force, by name.
func (v *views) Status() []viewStatus {
	s := v.cur.Load()
	if s == nil {
		return nil
	}
	out := make([]viewStatus, 0, len(s.all))
	for _, o := range s.all {
		st := viewStatus{Kind: "view", Name: o.route.Name, File: o.route.File, Topic: o.v.Topic, InPlace: o.route.InPlace(),
			Clients: clientsText(o.v.Clients), Steps: len(o.route.Steps), State: "running",
			Records: o.c.records.Load(), Filtered: o.c.filtered.Load(), Errors: o.c.errors.Load()}
		if o.v.Closed != "" {
			st.State, st.Closed, st.Clients = "closed", o.v.Closed, "every client"
		}
		out = append(out, st)
	}
	return out
}

// clientsText is a view's client list for people.
func clientsText(c *rules.ViewClients) string {
	if c == nil {
		return "every client"
	}
	var parts []string
	for _, l := range []struct {
		what string
		list []string
	}{{"client_id", c.ClientID}, {"principal", c.Principal}, {"tls_subject", c.TLSSubject}} {
		if len(l.list) > 0 {
			parts = append(parts, l.what+" "+strings.Join(l.list, ", "))
		}
	}
	return strings.Join(parts, "; ")
}

// viewSet is the views in force (protocol.Views).
type viewSet struct {
	byName map[string]*viewOf
	all    []*viewOf // by name
}

func match(c protocol.ViewClient) rules.ViewClientMatch {
	return rules.ViewClientMatch{ClientID: c.ClientID, Principal: c.Principal, TLSSubject: c.TLSSubject}
}

// Lookup returns the view of name that applies to c, or nil.
func (s *viewSet) Lookup(name string, c protocol.ViewClient) protocol.View {
	o := s.byName[name]
	if o == nil || !o.v.AppliesTo(match(c)) {
		return nil
	}
	return o
}

// Virtual lists the virtual names of the views that apply to c, with the
// topic each reads.
func (s *viewSet) Virtual(c protocol.ViewClient) map[string]string {
	var out map[string]string
	for _, o := range s.all {
		if o.route.InPlace() || !o.v.AppliesTo(match(c)) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[o.route.Name] = o.v.Topic
	}
	return out
}

// viewOf is one view in force (protocol.View).
type viewOf struct {
	route *rules.Route
	v     *rules.View
	c     *viewCounters
}

func (o *viewOf) Name() string  { return o.route.Name }
func (o *viewOf) Topic() string { return o.v.Topic }

// viewRecordPool holds the records Apply runs views on: one per record
// fetched through a view would be ~500 bytes of garbage each.
var viewRecordPool = sync.Pool{New: func() any { return new(operators.Record) }}

// Apply runs the view on one fetched record. The new value is built in
// rec.Scratch (the record's slices alias the fetched batch); headers are
// not changed.
func (o *viewOf) Apply(rec *protocol.ViewRecord) (bool, error) {
	r := viewRecordPool.Get().(*operators.Record)
	defer func() {
		*r = operators.Record{} // nothing of this record stays reachable from the pool
		viewRecordPool.Put(r)
	}()
	*r = operators.Record{Topic: o.v.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: rec.Key,
		Raw: rec.Value, Timestamp: rec.Timestamp, EventTime: rec.Timestamp}
	if len(rec.Headers) > 0 {
		r.Headers = make([]operators.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			r.Headers[i] = operators.Header{Key: h.Key, Value: h.Value}
		}
	}
	out, keep, err := o.v.Run(r, rec.Scratch[:0])
	if cap(out) > cap(rec.Scratch) {
		rec.Scratch = out[:0]
	}
	o.c.records.Add(1)
	switch {
	case err != nil:
		o.c.errors.Add(1)
		return false, err
	case !keep:
		o.c.filtered.Add(1)
		return false, nil
	}
	rec.Value = out
	return true, nil
}
