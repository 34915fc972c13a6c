package rules

// The route graph: what one rule file cannot see alone. Routes are joined
// by topics (a route reads its source and writes its sink and its dead
// letters) and by consumer groups. Across the files of a rules directory
// the loader refuses:
//
//   - two routes in one consumer group: the group splits the source's
//     partitions between them, each silently misses part of its source,
//     and `rtproxy state drop` of one deletes the other's group;
//   - a cycle of routes (a sink or dead_letter topic that is, through
//     other routes, the source of the route itself): one record would
//     circulate, and with explode multiply, forever;
//   - a sink, dead_letter or source that is a route's internal topic
//     (`<route>.NN-<step>.repartition` / `.changelog`): a foreign write
//     corrupts its shuffle or its restored state.
//
// The check is incremental, in priority order: each route is judged
// against the routes accepted before it, so the first of two conflicting
// files keeps running and the second is refused with an error naming the
// first. The accepted set never holds a cycle, so a new cycle always runs
// through the newcomer.

import (
	"fmt"
	"regexp"
	"strings"
)

// graph is the set of routes accepted so far.
type graph struct {
	routes  []*Route
	groups  map[string]*Route   // consumer group -> route
	readers map[string][]*Route // source topic -> routes reading it
	// views are the accepted views with a virtual name, by that name
	// (view.go; graph_view.go).
	views map[string]*Route
	// guards are the accepted guards that copy refused records to a
	// dead-letter topic, by that topic (a topic the rules write).
	guards map[string]*Route
}

func newGraph() *graph {
	return &graph{groups: map[string]*Route{}, readers: map[string][]*Route{}, views: map[string]*Route{}, guards: map[string]*Route{}}
}

// internalTopicRe is the shape of a route's internal topics after its
// name: pipeline names them "<route>.%02d-<kind>.repartition" and
// ".changelog" (pipeline/task.go).
var internalTopicRe = regexp.MustCompile(`^\.[0-9]{2,}-[a-z_]+\.(repartition|changelog)$`)

// internalTopicOf reports whether topic is one of the internal topics of
// the route named route.
func internalTopicOf(route, topic string) bool {
	return route != "" && strings.HasPrefix(topic, route) && internalTopicRe.MatchString(topic[len(route):])
}

// where is "file:line:col" of a key of r (its route name when the key is
// not written: a default).
func (r *Route) where(key string) string {
	p, ok := r.at[key]
	if !ok {
		p = r.at["route"]
	}
	return fmt.Sprintf("%s:%d:%d", r.File, p.line, p.col)
}

// errAt is an error at a key of r (its route name when not written).
func (r *Route) errAt(key, text, format string, args ...any) *Error {
	p, ok := r.at[key]
	if !ok {
		p = r.at["route"]
		text = r.Name
	}
	return &Error{File: r.File, Line: p.line, Col: p.col, Text: text, Msg: fmt.Sprintf(format, args...)}
}

// outputs are the topics r writes that another route could read: its sink
// and its dead letters, with the key each is written under.
func (r *Route) outputs() []struct{ key, topic string } {
	var out []struct{ key, topic string }
	if r.Switch == nil {
		out = append(out, struct{ key, topic string }{"sink.topic", r.Sink.Topic})
	}
	for i, b := range r.Switch {
		if b.Sink.Topic != "" {
			out = append(out, struct{ key, topic string }{switchTopicKey(i), b.Sink.Topic})
		}
	}
	if r.DeadLetter != "" && r.DeadLetter != r.Sink.Topic {
		out = append(out, struct{ key, topic string }{"dead_letter", r.DeadLetter})
	}
	return out
}

// check returns why r cannot join the graph, nil when it can. Guards are
// not routes: they read no topic as a group and write none.
func (g *graph) check(r *Route) []*Error {
	if r == nil {
		return nil
	}
	if r.Guard != nil {
		return g.guardVsViews(r)
	}
	if r.View != nil {
		return g.checkView(r)
	}
	errs := g.routeVsViews(r)
	if o := g.groups[r.GroupID()]; o != nil {
		key, how := "source.group", "source.group"
		if r.Source.Group == "" {
			how = "the default group (rtproxy.<route>)"
		}
		other := "source.group at " + o.where("source.group")
		if o.Source.Group == "" {
			other = "default group, route name at " + o.where("route")
		}
		errs = append(errs, r.errAt(key, r.Source.Group,
			"consumer group `%s` (%s) is also the group of route `%s` (its %s); two routes in one group split the partitions between them, each silently misses part of its source, and `rtproxy state drop` of one deletes the other's group. Give this route its own `source.group`",
			r.GroupID(), how, o.Name, other))
	}
	// Internal topics, both ways: r touching another route's, and another
	// route touching one r would create.
	touches := append(r.outputs(), struct{ key, topic string }{"source.topic", r.Source.Topic})
	for _, o := range append(g.routes, r) {
		for _, t := range touches {
			if internalTopicOf(o.Name, t.topic) {
				whose := fmt.Sprintf("route `%s` (%s)", o.Name, o.where("route"))
				if o == r {
					whose = "this route"
				}
				errs = append(errs, r.errAt(t.key, t.topic,
					"%s `%s` is an internal topic of %s (its repartition or changelog topic, `<route>.NN-<step>.repartition|changelog`); only that route may read and write it. Choose another topic",
					t.key, t.topic, whose))
			}
		}
		if o == r {
			continue
		}
		for _, t := range append(o.outputs(), struct{ key, topic string }{"source.topic", o.Source.Topic}) {
			if internalTopicOf(r.Name, t.topic) {
				errs = append(errs, r.errAt("route", r.Name,
					"route `%s` would own internal topics named `%s.NN-<step>.repartition|changelog`, and route `%s` (%s) uses `%s` as its %s; rename this route",
					r.Name, r.Name, o.Name, o.where(t.key), t.topic, t.key))
			}
		}
	}
	if e := g.cycle(r); e != nil {
		errs = append(errs, e)
	}
	return errs
}

// cycle finds a path from what r writes back to r's source through the
// accepted routes, and returns it as an error; nil when there is none.
func (g *graph) cycle(r *Route) *Error {
	type step struct {
		topic string
		via   *Route // the route that wrote topic
		key   string // sink.topic or dead_letter of via
		prev  *step
	}
	target := r.Source.Topic
	seen := map[string]bool{}
	var queue []*step
	for _, o := range r.outputs() {
		if !seen[o.topic] {
			seen[o.topic] = true
			queue = append(queue, &step{topic: o.topic, via: r, key: o.key})
		}
	}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		if s.topic == target {
			return g.cycleError(r, func(yield func(topic string, via *Route, key string)) {
				var path []*step
				for p := s; p != nil; p = p.prev {
					path = append(path, p)
				}
				for i := len(path) - 1; i >= 0; i-- {
					yield(path[i].topic, path[i].via, path[i].key)
				}
			})
		}
		for _, o := range g.readers[s.topic] {
			for _, out := range o.outputs() {
				if !seen[out.topic] {
					seen[out.topic] = true
					queue = append(queue, &step{topic: out.topic, via: o, key: out.key, prev: s})
				}
			}
		}
	}
	return nil
}

func (g *graph) cycleError(r *Route, path func(func(topic string, via *Route, key string))) *Error {
	var b strings.Builder
	first := ""
	dead := false
	fmt.Fprintf(&b, "`%s`", r.Source.Topic)
	path(func(topic string, via *Route, key string) {
		if first == "" {
			first = key
		}
		what := "writes"
		if key == "dead_letter" {
			what, dead = "dead-letters to", true
		}
		fmt.Fprintf(&b, " → route `%s` (%s) %s `%s`", via.Name, via.where(key), what, topic)
	})
	msg := fmt.Sprintf("the routes form a cycle: %s, the source of this route; each record would circulate forever (and multiply through explode). Break the cycle: write to a topic no route of the cycle reads", b.String())
	if dead {
		msg += " (dead letters count: a record that fails at each route would go round too)"
	}
	topic := ""
	for _, o := range r.outputs() {
		if o.key == first {
			topic = o.topic
		}
	}
	return r.errAt(first, topic, "%s", msg)
}

// add accepts r into the graph (after check found nothing).
func (g *graph) add(r *Route) {
	if r == nil {
		return
	}
	if r.Guard != nil {
		if r.Guard.DeadLetter != "" {
			g.guards[r.Guard.DeadLetter] = r
		}
		return
	}
	if r.View != nil {
		if !r.InPlace() {
			g.views[r.Name] = r
		}
		return
	}
	g.routes = append(g.routes, r)
	g.groups[r.GroupID()] = r
	g.readers[r.Source.Topic] = append(g.readers[r.Source.Topic], r)
}

// checkGraph judges the routes of results in order (the first file of a
// conflict keeps its route): a route that conflicts with one accepted
// before it is refused, its errors added to its file's result.
func checkGraph(results []*fileResult) {
	g := newGraph()
	for _, fr := range results {
		r := fr.res.route
		if r == nil || len(fr.res.errs) > 0 {
			continue
		}
		if errs := g.check(r); len(errs) > 0 {
			for _, e := range errs {
				e.File = fr.path
				fr.res.errs = append(fr.res.errs, e)
			}
			fr.res.route = nil
			continue
		}
		g.add(r)
	}
}
