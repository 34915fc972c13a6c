package rules

// The `switch` step (operators/switch.go): a list of branches, each a
// condition and a sink. The step itself only chooses a branch; the sinks
// are the route's (Route.Switch), read here with the same parser as the
// top-level `sink:` (sinkSpec), so a branch's sink has every key a route's
// sink has but `delivery`, which is the route's (the top-level `sink:` of
// a switch route holds only that).

import (
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/operators"
)

var (
	branchKeys     = []string{"when", "sink"}
	branchSinkKeys = []string{"topic", "http", "key", "format", "subject", "schema", "message", "message_indexes"}
)

const switchExample = "`- switch: [ { when: value.amount > 1000, sink: { topic: payments.large } }, { sink: { topic: payments.rest } } ]`"

// branches reads the body of a switch step: its branches into the route
// (Route.Switch) and what the step needs of them into the returned list.
func (p *stepParse) branches(x *keyVal, what string) ([]operators.Branch, bool) {
	l, r := p.l, p.r
	if x.val.Kind != yaml.SequenceNode || len(x.val.Content) == 0 {
		l.errAt(x.val, x.key.Value, "`%s` must be a list of branches, e.g. %s", what, switchExample)
		return nil, false
	}
	var out []operators.Branch
	r.Switch = nil
	l.branchFields = nil
	ok := true
	for i, item := range x.val.Content {
		item = resolve(item)
		where := fmt.Sprintf("switch branch %d", i+1)
		if item.Kind != yaml.MappingNode {
			l.errAt(item, item.Value, "%s must be a mapping `{ when: CONDITION, sink: { topic: TOPIC } }`", where)
			ok = false
			continue
		}
		f := l.fields(item, branchKeys, where)
		b := Branch{Line: item.Line}
		b.Sink.Delivery = r.Sink.Delivery
		if w := f["when"]; w != nil {
			if b.When = l.expr(w, where+" when", p.sc, exprBool); b.When == nil {
				ok = false
			}
		} else if i != len(x.val.Content)-1 {
			l.errAt(item, "", "%s has no `when`: only the last branch may be the default, taking every record the branches before it did not (a branch after it could never be taken)", where)
			ok = false
		}
		sk := f["sink"]
		sf := map[string]*keyVal{}
		switch {
		case sk == nil:
			l.errAt(item, "", "%s needs `sink`: where its records go, e.g. `sink: { topic: payments.large }`", where)
			ok = false
		case !l.mapping(sk, where+" sink", "`sink: { topic: payments.large }`"):
			ok = false
		default:
			n := len(l.errs)
			sf = l.fields(sk.val, branchSinkKeys, where+" sink")
			l.sinkSpec(sk, sf, &b.Sink, r, switchTopicKey(i))
			if b.Sink.HTTP != nil {
				b.Sink.Name = "http-" + strconv.Itoa(i+1)
				if r.Sink.ExactlyOnce() {
					l.errAt(sf["http"].key, "http", "%s: %v", where, errHTTPExactlyOnce)
				}
			}
			if k := sf["key"]; k != nil {
				b.Sink.Key = l.expr(k, where+" sink.key", p.sc, exprAny)
			}
			if len(l.errs) > n {
				ok = false
			}
		}
		r.Switch = append(r.Switch, b)
		l.branchFields = append(l.branchFields, sf)
		out = append(out, operators.Branch{When: b.When, Sink: b.Sink.Name})
	}
	return out, ok
}

// branchesDef is the canonical text of a switch's branches (its
// fingerprint's part): each condition and where its sink writes.
func (p *stepParse) branchesDef() string {
	def := ""
	for i, b := range p.r.Switch {
		when := "true"
		if b.When != nil {
			when = canonical(b.When.Source)
		}
		key := ""
		if b.Sink.Key != nil {
			key = canonical(b.Sink.Key.Source)
		}
		def += fmt.Sprintf("%d:when=%s sink=%s key=%s format=%s subject=%s\x00", i, when, b.Sink.Target(), key, b.Sink.Format, b.Sink.Subject)
	}
	return def
}

// checkSwitch refuses a switch that is not the last step: it sends each
// record to a sink, so nothing after it would run.
func (l *loader) checkSwitch(steps *keyVal) {
	if steps == nil || steps.val.Kind != yaml.SequenceNode {
		return
	}
	items := steps.val.Content
	for i, item := range items {
		item = resolve(item)
		if item.Kind != yaml.MappingNode || len(item.Content) == 0 {
			continue
		}
		if k := resolve(item.Content[0]); k.Value == "switch" && i != len(items)-1 {
			l.errAt(k, "switch", "`switch` must be the last step: it sends each record to the sink of a branch, so the steps after it would never run. Move them before the switch (a route has one switch)")
		}
	}
}

// checkSwitchTopics refuses switch sinks that collide: two branches
// writing one topic (merge their conditions with `or`, or key the one
// sink), a branch writing the dead-letter topic.
func (l *loader) checkSwitchTopics(r *Route) {
	seen := map[string]int{}
	for i, b := range r.Switch {
		t := b.Sink.Topic
		if t == "" {
			continue
		}
		p := r.at[switchTopicKey(i)]
		if j, dup := seen[t]; dup {
			l.errAtPos(p.line, p.col, t, "switch branches %d and %d both write topic `%s`; a topic is one sink: join their conditions with `or` in one branch", j+1, i+1, t)
			continue
		}
		seen[t] = i
		if t == r.DeadLetter {
			l.errAtPos(p.line, p.col, t, "switch branch %d writes the dead-letter topic `%s`; dead letters would mix with results. Choose another topic, or set `dead_letter:`", i+1, t)
		}
	}
}

// switchTopicKey is where branch i's topic is kept in Route.at, and how
// the route graph checks name it in messages.
func switchTopicKey(i int) string { return fmt.Sprintf("switch branch %d sink.topic", i+1) }
