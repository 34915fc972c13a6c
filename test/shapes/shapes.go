// Package shapes is a differential test of route shapes (issue 24): it
// generates random routes — chains of filter, set, map, explode, tumbling
// and sliding windows and drop_duplicates, with one to three keyed steps
// and random keys — and random out-of-order inputs with late records and
// records that fail, and computes what the route must write with a
// brute-force reference written here from the rule semantics
// (docs/RULES.md, docs/ARCHITECTURE.md), sharing no code with operators/
// or pipeline/. Tests run the same shape through pipeline.Driver, through
// one in-process instance against kfake, and through three rtproxy
// binaries (test/integration), and compare every output and dead letter.
// GenerateSessions makes the same shapes with session windows (gap,
// max_duration) in place of the tumbling and sliding ones. Two shapes of
// three end in a switch (issue 27): one to three branches with conditions
// on what reaches them and keys of their own, maybe a default branch,
// maybe after a join in a table whose row the conditions read; the
// reference sends each record to its branch's topic (the first whose
// condition holds), drops and counts what no branch takes, and outputs
// are compared with their topic. The switch and the join draw from a
// random source of their own, so a seed's other steps and inputs are
// what they were before switches.
//
// # The reference's assumptions
//
// The reference processes the source records one at a time in the order
// given, as the Driver does (each record and everything it causes, then
// the next). Its watermark is the rule's: the minimum over the source
// partitions of (newest event time − source.watermark), undefined until
// every partition has had a record with an event time (the Driver's clock
// does not move while records are sent, so a partition not heard from
// holds it back and nothing is idle). Every keyed step reads the same
// watermark: a repartition hands each writer's frontier to every
// partition (invariant 39), so a record is applied at every keyed step
// under the watermark from before its own source record, and the rows a
// window emits when the watermark moves reach later keyed steps before
// those move (a writer's rows go before its marker). After the last
// record the test moves every source partition's frontier far ahead
// (Driver.AdvanceWatermark), which closes every window.
//
// What depends on arrival order across partitions is kept out of the
// shapes or made not to matter: a drop_duplicates after a window is keyed
// by the row's key (one writer, rows in window order), a window after a
// window by the row key, a function of it or a constant, and aggregates
// are count and sum of integers; emit: on_update (every intermediate
// state) only on a window of events, which arrive in the order sent, and
// so is a session's max_duration (where it binds, the session a record
// joins depends on the order records come in). The
// live variants (Live true) go further: each partition's event times
// rise with less disorder than source.watermark (no record is late
// whatever the interleaving), duplicates are exact copies,
// drop_duplicates has no ttl and no key that different records share,
// windows emit on close only, and one flush record per partition an hour
// ahead closes the windows instead of AdvanceWatermark (its own outputs
// are left out of the comparison).
package shapes

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/pipeline"
)

// Base is the event time the inputs start at (the Driver's default start).
var Base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// FlushID is the id prefix of the live variants' flush records.
const FlushID = "flush-"

// Shape is one generated route with its input.
type Shape struct {
	Seed       uint64
	Live       bool
	Name       string // route name
	Topic      string // source topic
	Sink, DLQ  string
	Partitions int
	Lateness   int64 // source.watermark, millis
	Steps      []Step
	Inputs     []Input
	// Far is where the test moves every frontier after the last record
	// (not used by the live variants: their flush records do it).
	Far int64
	// Sessions: every window is a session window (GenerateSessions).
	Sessions bool
	// Branches are the sinks of the shape's last step, a switch (nil: the
	// route writes Sink); Table the rows of its table `tb` (nil: none),
	// which a join before the switch looks records up in.
	Branches []Branch
	Table    map[string]map[string]any
	merges   int // sessions merged into another, as Expected last saw
	capped   int // records max_duration kept from merging, as Expected last saw
	// switchDrops counts the records no branch took, as Expected last saw
	// them; switchDropsFlush those of them the live variants' flush
	// records caused.
	switchDrops, switchDropsFlush int
}

// Branch is one branch of a shape's switch: its condition ("" for the
// default branch) and sink's topic and key ("" keeps the record's key),
// as the rule says them, and how the reference evaluates them.
type Branch struct {
	When, Topic, Key string
	when             func(*rec) (bool, error)
	key              func(*rec) string
}

// Input is one source record.
type Input struct {
	Partition int32
	Key       []byte
	Value     []byte
}

// Output is one record the route wrote, in the form both sides are
// compared in.
type Output struct {
	Topic      string // outputs: the sink's topic
	DeadLetter bool
	Reason     string // dead letters: rtproxy-reason
	Step       string // dead letters: rtproxy-step
	Key        string
	Value      string // canonical JSON, or the bytes when not JSON
}

func (o Output) String() string {
	if o.DeadLetter {
		return fmt.Sprintf("DLQ reason=%s step=%s key=%q value=%s", o.Reason, o.Step, o.Key, o.Value)
	}
	return fmt.Sprintf("OUT topic=%s key=%q value=%s", o.Topic, o.Key, o.Value)
}

// Canonical is the comparable form of a written value: JSON decoded and
// encoded again (sorted members, numbers as float64 print), or the bytes.
func Canonical(b []byte) string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return "raw:" + string(b)
	}
	c, _ := json.Marshal(v)
	return string(c)
}

func canonicalValue(v any) string {
	if r, ok := v.(rawText); ok {
		return "raw:" + string(r)
	}
	c, err := json.Marshal(v)
	if err != nil {
		return "unencodable:" + err.Error()
	}
	return Canonical(c)
}

// rawText is a source value that is not JSON.
type rawText string

// shapeKind is what a step sees: a source-shaped event, or a window row.
type shapeKind int

const (
	event shapeKind = iota
	row
)

// Step is one generated step: its YAML and its reference semantics.
type Step struct {
	YAML  string
	Kind  string // the rule's step kind
	Keyed bool
	// the reference
	process func(st *stepState, r *rec, emit func(*rec), dl func(*rec, string))
	advance func(st *stepState, wm int64, emit func(*rec)) // timed steps only
	live    bool                                           // allowed in the live variants
}

// stepState is one run's state of a step.
type stepState struct {
	hasWM bool
	wm    int64
	// windows: end → key → accumulators
	wins map[int64]map[string]*acc
	// session windows: key → its open sessions, by start; merges counts
	// the sessions that merged into another
	sess   map[string][]*refSession
	merges int
	capped int // records max_duration kept from merging
	// drop_duplicates: key → event time of the record that passed
	seen map[string]int64
	// switch: the records no branch took, and those of them flush
	// records caused
	drops, dropsFlush int
}

type acc struct {
	n   float64
	sum float64
}

// rec is a record in the reference.
type rec struct {
	sink  string // the topic a switch sent it to ("": the route's sink)
	key   []byte
	val   any // map[string]any, or rawText
	ev    int64
	bound map[string]any
}

func (r *rec) obj() map[string]any { m, _ := r.val.(map[string]any); return m }

// copyObj is a shallow copy of r's object (set and map never change a
// value other records share).
func copyObj(m map[string]any) map[string]any {
	c := make(map[string]any, len(m)+2)
	for k, v := range m {
		c[k] = v
	}
	return c
}

func num(v any) (float64, error) {
	if f, ok := v.(float64); ok {
		return f, nil
	}
	return 0, fmt.Errorf("not a number: %v", v)
}

// Generate makes the shape of seed. live restricts it to what a live run
// can check whatever the interleaving of partitions; the source gets at
// least minParts partitions.
func Generate(seed uint64, live bool, minParts int) *Shape {
	return generate(seed, live, minParts, false)
}

// GenerateSessions is Generate with every window a session window (of
// events or of rows, emitting on close or on update, with or without
// max_duration). Its shapes are its own: seed n here is not Generate's.
func GenerateSessions(seed uint64, live bool, minParts int) *Shape {
	return generate(seed, live, minParts, true)
}

func generate(seed uint64, live bool, minParts int, sessions bool) *Shape {
	rng := rand.New(rand.NewPCG(seed, 0x5ea1))
	if sessions {
		rng = rand.New(rand.NewPCG(seed, 0x5e55))
	}
	s := &Shape{Seed: seed, Live: live, Name: fmt.Sprintf("shape-%d", seed), Partitions: max(1+rng.IntN(5), minParts), Sessions: sessions}
	if sessions {
		s.Name = fmt.Sprintf("shape-s%d", seed)
	}
	s.Topic = s.Name + ".in"
	s.Sink, s.DLQ = s.Name+".out", s.Name+".dlq"
	s.Lateness = []int64{0, 500, 1000, 2000}[rng.IntN(4)]
	if live {
		s.Lateness = []int64{1000, 2000}[rng.IntN(2)]
	}
	shape := genSteps(s, rng)
	// The switch and the join before it draw from their own source, so
	// that the rest of a seed's shape and its inputs are what they were
	// before shapes had them.
	genSwitch(s, rand.New(rand.NewPCG(seed, 0x5317c4)), shape)
	genInputs(s, rng)
	return s
}

// YAML is the shape's rule file.
func (s *Shape) YAML() string {
	var b strings.Builder
	fmt.Fprintf(&b, "route: %s\n", s.Name)
	fmt.Fprintf(&b, "source: { topic: %s, event_time: value.ts, watermark: %dms, idle_timeout: 30s }\n", s.Topic, s.Lateness)
	if s.Branches == nil {
		fmt.Fprintf(&b, "sink: { topic: %s }\n", s.Sink)
	}
	fmt.Fprintf(&b, "dead_letter: %s\n", s.DLQ)
	if s.Table != nil {
		fmt.Fprintf(&b, "tables:\n  tb: { file: %s, key: id }\n", TableFile)
	}
	b.WriteString("checkpoint_interval: 200ms\n")
	b.WriteString("steps:\n")
	for _, st := range s.Steps {
		fmt.Fprintf(&b, "  - %s\n", st.YAML)
	}
	return b.String()
}

// --- steps ---------------------------------------------------------------

func genSteps(s *Shape, rng *rand.Rand) shapeKind {
	keyed := 1 + rng.IntN(3)
	shape := event
	explodes := 0
	add := func(st Step) { s.Steps = append(s.Steps, st) }
	stateless := func() {
		for range rng.IntN(3) {
			switch shape {
			case event:
				switch rng.IntN(5) {
				case 0, 1:
					add(eventFilter(rng))
				case 2:
					add(eventSet(rng))
				case 3:
					add(eventMap(rng))
				case 4:
					explodes++
					name := fmt.Sprint("tg", explodes)
					add(Step{YAML: fmt.Sprintf("explode: { each: value.tags, as: %s }", name), Kind: "explode", live: true,
						process: explodeProc(name)})
					add(Step{YAML: fmt.Sprintf("set: { tag: %s }", name), Kind: "set", live: true,
						process: func(_ *stepState, r *rec, emit func(*rec), _ func(*rec, string)) {
							m := copyObj(r.obj())
							m["tag"] = r.bound[name]
							emit(&rec{key: r.key, val: m, ev: r.ev, bound: r.bound})
						}})
				}
			case row:
				switch rng.IntN(3) {
				case 0:
					add(rowFilter(rng))
				case 1:
					add(Step{YAML: "set: { avg: value.s / value.n }", Kind: "set", live: true,
						process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
							m := copyObj(r.obj())
							m["avg"] = m["s"].(float64) / m["n"].(float64)
							emit(&rec{key: r.key, val: m, ev: r.ev})
						}})
				case 2:
					add(Step{YAML: "map: { key: value.key, n: value.n, s: value.s * 2 }", Kind: "map", live: true,
						process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
							m := r.obj()
							emit(&rec{key: r.key, val: map[string]any{"key": m["key"], "n": m["n"], "s": m["s"].(float64) * 2}, ev: r.ev})
						}})
				}
			}
		}
	}
	stateless()
	for k := 0; k < keyed; k++ {
		choice := rng.IntN(3)
		switch {
		case choice == 0 && shape == event:
			add(eventDedup(rng, s.Live))
		case choice == 0:
			add(dedupStep("value.key", ttlFor(rng, s.Live), func(r *rec) string { return r.obj()["key"].(string) }))
		default:
			// on_update rows show every intermediate state, so they need
			// the window's input in one order: events come in the order
			// sent (the Driver), rows of an earlier window from several
			// tasks would not.
			onUpdate := !s.Live && shape == event && rng.IntN(4) == 0
			if s.Sessions {
				add(sessionStep(rng, shape, onUpdate, !s.Live && shape == event && rng.IntN(2) == 0))
			} else {
				add(windowStep(rng, shape, choice == 1, onUpdate))
			}
			shape = row
		}
		stateless()
	}
	return shape
}

func eventFilter(rng *rand.Rand) Step {
	c := rng.IntN(60)
	switch rng.IntN(3) {
	case 0:
		return Step{YAML: fmt.Sprintf("filter: value.a > %d", c), Kind: "filter", live: true,
			process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
				a, err := num(r.obj()["a"])
				if err != nil {
					dl(r, "error")
					return
				}
				if a > float64(c) {
					emit(r)
				}
			}}
	case 1:
		return Step{YAML: `filter: value.g != "x"`, Kind: "filter", live: true,
			process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
				if r.obj()["g"] != "x" {
					emit(r)
				}
			}}
	}
	return Step{YAML: fmt.Sprintf(`filter: value.g == "y" || value.a < %d`, c), Kind: "filter", live: true,
		process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
			if r.obj()["g"] == "y" {
				emit(r)
				return
			}
			a, err := num(r.obj()["a"])
			if err != nil {
				dl(r, "error")
				return
			}
			if a < float64(c) {
				emit(r)
			}
		}}
}

func rowFilter(rng *rand.Rand) Step {
	if rng.IntN(2) == 0 {
		c := 1 + rng.IntN(3)
		return Step{YAML: fmt.Sprintf("filter: value.n >= %d", c), Kind: "filter", live: true,
			process: func(_ *stepState, r *rec, emit func(*rec), _ func(*rec, string)) {
				if r.obj()["n"].(float64) >= float64(c) {
					emit(r)
				}
			}}
	}
	c := rng.IntN(100)
	return Step{YAML: fmt.Sprintf("filter: value.s > %d", c), Kind: "filter", live: true,
		process: func(_ *stepState, r *rec, emit func(*rec), _ func(*rec, string)) {
			if r.obj()["s"].(float64) > float64(c) {
				emit(r)
			}
		}}
}

func eventSet(rng *rand.Rand) Step {
	c := 1 + rng.IntN(9)
	switch rng.IntN(3) {
	case 0:
		return Step{YAML: fmt.Sprintf("set: { a: value.a + %d }", c), Kind: "set", live: true,
			process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
				a, err := num(r.obj()["a"])
				if err != nil {
					dl(r, "error")
					return
				}
				m := copyObj(r.obj())
				m["a"] = a + float64(c)
				emit(&rec{key: r.key, val: m, ev: r.ev, bound: r.bound})
			}}
	case 1:
		return Step{YAML: "set: { b: value.a * 2, g: value.g + \"!\" }", Kind: "set", live: true,
			process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
				a, err := num(r.obj()["a"])
				if err != nil {
					dl(r, "error")
					return
				}
				m := copyObj(r.obj())
				m["b"] = a * 2
				m["g"] = m["g"].(string) + "!"
				emit(&rec{key: r.key, val: m, ev: r.ev, bound: r.bound})
			}}
	}
	return Step{YAML: `set: { g: value.g + "y", k2: value.k2 + value.g }`, Kind: "set", live: true,
		process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
			m := copyObj(r.obj())
			g := m["g"].(string)
			m["g"] = g + "y"
			m["k2"] = m["k2"].(string) + g
			emit(&rec{key: r.key, val: m, ev: r.ev, bound: r.bound})
		}}
}

// eventMap keeps the source's fields (later steps read them) but for
// what set added, and changes a.
func eventMap(rng *rand.Rand) Step {
	c := 1 + rng.IntN(9)
	return Step{YAML: fmt.Sprintf("map: { id: value.id, k1: value.k1, k2: value.k2, g: value.g, ts: value.ts, tags: value.tags, a: value.a - %d }", c),
		Kind: "map", live: true,
		process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
			o := r.obj()
			a, err := num(o["a"])
			if err != nil {
				dl(r, "error")
				return
			}
			m := map[string]any{"id": o["id"], "k1": o["k1"], "k2": o["k2"], "g": o["g"], "ts": o["ts"], "tags": o["tags"], "a": a - float64(c)}
			emit(&rec{key: r.key, val: m, ev: r.ev, bound: r.bound})
		}}
}

func explodeProc(name string) func(*stepState, *rec, func(*rec), func(*rec, string)) {
	return func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
		switch l := r.obj()["tags"].(type) {
		case nil:
			return
		case []any:
			for _, e := range l {
				b := make(map[string]any, len(r.bound)+1)
				for k, v := range r.bound {
					b[k] = v
				}
				b[name] = e
				emit(&rec{key: r.key, val: r.val, ev: r.ev, bound: b})
			}
		default:
			dl(r, "error")
		}
	}
}

func ttlFor(rng *rand.Rand, live bool) int64 {
	if live || rng.IntN(2) == 0 {
		return 0
	}
	return []int64{1000, 3000, 10000}[rng.IntN(3)]
}

func eventDedup(rng *rand.Rand, live bool) Step {
	ttl := ttlFor(rng, live)
	if live || rng.IntN(2) == 0 {
		return dedupStep("value.id", ttl, func(r *rec) string { return r.obj()["id"].(string) })
	}
	return dedupStep("value.k2", ttl, func(r *rec) string { return r.obj()["k2"].(string) })
}

// dedupStep: a record passes when its key is unknown, or known from a
// record whose event time + ttl is at or before its own; it is then the
// one the key is remembered by. Advance forgets keys whose time + ttl is
// at or before the watermark.
func dedupStep(keyExpr string, ttl int64, key func(*rec) string) Step {
	y := fmt.Sprintf("drop_duplicates: { key: %s }", keyExpr)
	if ttl > 0 {
		y = fmt.Sprintf("drop_duplicates: { key: %s, ttl: %dms }", keyExpr, ttl)
	}
	st := Step{YAML: y, Kind: "drop_duplicates", Keyed: true, live: ttl == 0,
		process: func(st *stepState, r *rec, emit func(*rec), _ func(*rec, string)) {
			k := key(r)
			if t, ok := st.seen[k]; ok && (ttl == 0 || r.ev < t+ttl) {
				return
			}
			st.seen[k] = r.ev
			emit(r)
		}}
	if ttl > 0 {
		st.advance = func(st *stepState, wm int64, _ func(*rec)) {
			for k, t := range st.seen {
				if t+ttl <= wm {
					delete(st.seen, k)
				}
			}
		}
	}
	return st
}

// windowStep is a tumbling or sliding window with the aggregates n:
// count() and s: sum of a (events) or of s (rows), emitting on close, or
// with onUpdate the window's row after every change (ascending end) and
// nothing at close.
func windowStep(rng *rand.Rand, shape shapeKind, tumbling, onUpdate bool) Step {
	var size, slide int64
	if shape == event {
		size = []int64{1000, 2000, 5000}[rng.IntN(3)]
	} else {
		size = []int64{5000, 10000, 20000}[rng.IntN(3)]
	}
	slide = size
	kind := "tumbling"
	if !tumbling {
		kind = "sliding"
		slide = size / int64(2+rng.IntN(2))
		size = max(size, slide*2)
	}
	var keyExpr, sumOf string
	var key func(*rec) string
	if shape == event {
		sumOf = "value.a"
		keyExpr, key = eventKey(rng)
	} else {
		sumOf = "value.s"
		switch rng.IntN(3) {
		case 0:
			keyExpr, key = "value.key", func(r *rec) string { return r.obj()["key"].(string) }
		case 1:
			keyExpr, key = `value.key + "~"`, func(r *rec) string { return r.obj()["key"].(string) + "~" }
		default:
			keyExpr, key = `'"all"'`, func(*rec) string { return "all" }
		}
	}
	y := fmt.Sprintf("window: { kind: %s, size: %dms, ", kind, size)
	if kind == "sliding" {
		y += fmt.Sprintf("slide: %dms, ", slide)
	}
	emit := "on_close"
	if onUpdate {
		emit = "on_update"
	}
	y += fmt.Sprintf("key: %s, emit: %s, aggregate: { n: count(), s: sum(%s) } }", keyExpr, emit, sumOf)
	mkRow := func(end int64, k string, a *acc) *rec {
		return &rec{key: []byte(k), ev: end - 1, val: map[string]any{"key": k, "window_start": float64(end - size),
			"window_end": float64(end), "n": a.n, "s": a.sum}}
	}
	field := "a"
	if shape == row {
		field = "s"
	}
	return Step{YAML: y, Kind: "window", Keyed: true, live: true,
		process: func(st *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
			k := key(r)
			// Every window [j·slide, j·slide+size) holding ev that is
			// still open (end > watermark).
			var ends []int64
			for j := floorDiv(r.ev-size, slide) + 1; j*slide <= r.ev; j++ {
				if end := j*slide + size; !st.hasWM || end > st.wm {
					ends = append(ends, end)
				}
			}
			if len(ends) == 0 {
				dl(r, "late")
				return
			}
			v, err := num(r.obj()[field])
			if err != nil && r.obj()[field] != nil {
				dl(r, "error")
				return
			}
			for _, end := range ends {
				m := st.wins[end]
				if m == nil {
					m = map[string]*acc{}
					st.wins[end] = m
				}
				a := m[k]
				if a == nil {
					a = &acc{}
					m[k] = a
				}
				a.n++
				a.sum += v
				if onUpdate {
					emit(mkRow(end, k, a))
				}
			}
		},
		advance: func(st *stepState, wm int64, emit func(*rec)) {
			var ends []int64
			for end := range st.wins {
				if end <= wm {
					ends = append(ends, end)
				}
			}
			slices.Sort(ends)
			for _, end := range ends {
				keys := make([]string, 0, len(st.wins[end]))
				for k := range st.wins[end] {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					if !onUpdate {
						emit(mkRow(end, k, st.wins[end][k]))
					}
				}
				delete(st.wins, end)
			}
		}}
}

// refSession is an open session of the reference: its interval and the
// arguments of its records (for n: count() and s: sum), recounted whole
// for every row.
type refSession struct {
	start, end int64
	vals       []float64 // a null argument counts as a record, adds 0
}

// sessionStep is a session window with the aggregates n: count() and s:
// sum, from docs/RULES.md ("Session windows"): a key's open sessions are
// disjoint intervals [start, end); a record at t meets those whose
// interval meets [t, t+gap); with none it opens [t, t+gap); with some it
// merges them all, [min start, max end), unless that spans more than
// max_duration: then it joins the session holding t (whose end moves to
// t+gap, at most start+max_duration and at most the next session's
// start) or, in none, opens [t, min(t+gap, next start)). A record whose
// session would end at or before the watermark is late. Sessions close
// when the watermark reaches their end, in order of end, key, start.
// capped adds max_duration (only where the order of records is the
// order sent: events, in the Driver).
func sessionStep(rng *rand.Rand, shape shapeKind, onUpdate, capped bool) Step {
	var gap int64
	if shape == event {
		gap = []int64{300, 800, 2000}[rng.IntN(3)]
	} else {
		gap = []int64{3000, 6000, 12000}[rng.IntN(3)]
	}
	var maxDur int64
	if capped {
		maxDur = gap * []int64{1, 2, 4}[rng.IntN(3)]
	}
	var keyExpr, sumOf string
	var key func(*rec) string
	if shape == event {
		sumOf = "value.a"
		keyExpr, key = eventKey(rng)
	} else {
		sumOf = "value.s"
		if rng.IntN(2) == 0 {
			keyExpr, key = "value.key", func(r *rec) string { return r.obj()["key"].(string) }
		} else {
			keyExpr, key = `'"all"'`, func(*rec) string { return "all" }
		}
	}
	emit := "on_close"
	if onUpdate {
		emit = "on_update"
	}
	y := fmt.Sprintf("window: { kind: session, gap: %dms, ", gap)
	if maxDur > 0 {
		y += fmt.Sprintf("max_duration: %dms, ", maxDur)
	}
	y += fmt.Sprintf("key: %s, emit: %s, aggregate: { n: count(), s: sum(%s) } }", keyExpr, emit, sumOf)
	field := "a"
	if shape == row {
		field = "s"
	}
	mkRow := func(k string, ss *refSession) *rec {
		var sum float64
		for _, v := range ss.vals {
			sum += v
		}
		return &rec{key: []byte(k), ev: ss.end - 1, val: map[string]any{"key": k, "window_start": float64(ss.start),
			"window_end": float64(ss.end), "n": float64(len(ss.vals)), "s": sum}}
	}
	return Step{YAML: y, Kind: "window", Keyed: true, live: maxDur == 0 && !onUpdate,
		process: func(st *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
			k, t := key(r), r.ev
			list := st.sess[k]
			var meet []int // indexes into list, ascending
			for i, ss := range list {
				if ss.start < t+gap && t < ss.end {
					meet = append(meet, i)
				}
			}
			// What the record does: join list[into] (after merging
			// list[into..to]), or open [start, end) at list position at.
			into, to, at := -1, -1, 0
			var start, end int64
			for at < len(list) && list[at].start < t {
				at++
			}
			switch {
			case len(meet) == 0:
				start, end = t, t+gap
			default:
				lo, hi := min(t, list[meet[0]].start), max(t+gap, list[meet[len(meet)-1]].end)
				if maxDur == 0 || hi-lo <= maxDur {
					into, to, start, end = meet[0], meet[len(meet)-1], lo, hi
					break
				}
				st.capped++
				for _, i := range meet {
					if ss := list[i]; ss.start <= t && t < ss.end {
						e := max(ss.end, min(t+gap, ss.start+maxDur))
						if i+1 < len(list) {
							e = min(e, list[i+1].start)
						}
						into, to, start, end = i, i, ss.start, e
					}
				}
				if into < 0 {
					start, end = t, min(t+gap, list[meet[0]].start)
				}
			}
			if st.hasWM && end <= st.wm {
				dl(r, "late")
				return
			}
			v, err := num(r.obj()[field])
			if err != nil && r.obj()[field] != nil {
				dl(r, "error")
				return
			}
			var ss *refSession
			if into < 0 {
				ss = &refSession{}
				list = slices.Insert(list, at, ss)
			} else {
				ss = list[into]
				for _, o := range list[into+1 : to+1] {
					ss.vals = append(ss.vals, o.vals...)
					st.merges++
				}
				list = slices.Delete(list, into+1, to+1)
			}
			ss.start, ss.end = start, end
			ss.vals = append(ss.vals, v)
			st.sess[k] = list
			if onUpdate {
				emit(mkRow(k, ss))
			}
		},
		advance: func(st *stepState, wm int64, emit func(*rec)) {
			type closed struct {
				k  string
				ss *refSession
			}
			var cs []closed
			for k, list := range st.sess {
				kept := list[:0]
				for _, ss := range list {
					if ss.end <= wm {
						cs = append(cs, closed{k, ss})
					} else {
						kept = append(kept, ss)
					}
				}
				st.sess[k] = kept
			}
			sort.Slice(cs, func(i, j int) bool {
				a, b := cs[i], cs[j]
				if a.ss.end != b.ss.end {
					return a.ss.end < b.ss.end
				}
				if a.k != b.k {
					return a.k < b.k
				}
				return a.ss.start < b.ss.start
			})
			for _, c := range cs {
				if !onUpdate {
					emit(mkRow(c.k, c.ss))
				}
			}
		}}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// --- inputs --------------------------------------------------------------

func genInputs(s *Shape, rng *rand.Rand) {
	n := 40 + rng.IntN(160)
	maxEv := make([]int64, s.Partitions)
	for i := range maxEv {
		maxEv[i] = Base
	}
	for i := range n {
		p := int32(rng.IntN(s.Partitions))
		if s.Live && i < s.Partitions {
			p = int32(i) // every partition gets records
		}
		ev := maxEv[p] + int64(rng.IntN(700))
		switch {
		case s.Live:
			// Disorder below the allowed lateness: never late.
			ev = maxEv[p] - int64(rng.IntN(int(s.Lateness))) + int64(rng.IntN(600))
		case rng.IntN(8) == 0:
			ev = maxEv[p] - int64(rng.IntN(15000)) // behind: late or not
		}
		maxEv[p] = max(maxEv[p], ev)
		id := fmt.Sprint("r", i)
		v := map[string]any{"id": id, "k1": fmt.Sprint("k", rng.IntN(4)), "k2": fmt.Sprint("q", rng.IntN(12)),
			"a": float64(rng.IntN(50)), "g": []string{"x", "y", "z"}[rng.IntN(3)], "ts": float64(ev)}
		var tags []any
		for j := range rng.IntN(4) {
			tags = append(tags, fmt.Sprint("t", j))
		}
		v["tags"] = tags
		if tags == nil {
			v["tags"] = []any{}
		}
		var raw []byte
		switch rng.IntN(40) {
		case 0:
			raw = []byte(fmt.Sprintf("not json %d {", i))
		case 1:
			delete(v, "ts")
		case 2:
			v["a"] = "many"
		case 3:
			v["tags"] = "none"
		case 4:
			delete(v, "tags")
		}
		if raw == nil {
			raw, _ = json.Marshal(v)
		}
		s.Inputs = append(s.Inputs, Input{Partition: p, Key: []byte(id), Value: raw})
		if rng.IntN(6) == 0 {
			// A copy on another partition (the live variants: an exact
			// copy; the Driver's: maybe another event time).
			q := int32(rng.IntN(s.Partitions))
			cp := raw
			if !s.Live && rng.IntN(2) == 0 && v["ts"] != nil {
				c := copyObj(v)
				c["ts"] = float64(maxEv[q] + int64(rng.IntN(900)))
				cp, _ = json.Marshal(c)
			}
			if s.Live {
				var cv map[string]any
				if json.Unmarshal(cp, &cv) == nil && cv["ts"] != nil && cv["ts"].(float64) < float64(maxEv[q]-s.Lateness+1) {
					continue // would be late on q
				}
			}
			if json.Valid(cp) {
				var cv map[string]any
				json.Unmarshal(cp, &cv)
				if t, ok := cv["ts"].(float64); ok {
					maxEv[q] = max(maxEv[q], int64(t))
				}
			}
			s.Inputs = append(s.Inputs, Input{Partition: q, Key: []byte(id), Value: cp})
		}
	}
	top := slices.Max(maxEv)
	s.Far = top + 24*time.Hour.Milliseconds()
	if s.Live {
		for p := range s.Partitions {
			id := fmt.Sprint(FlushID, p)
			v, _ := json.Marshal(map[string]any{"id": id, "k1": "kf", "k2": id, "a": 1.0, "g": "z", "tags": []any{"t0"},
				"ts": float64(top + time.Hour.Milliseconds())})
			s.Inputs = append(s.Inputs, Input{Partition: int32(p), Key: []byte(id), Value: v})
		}
	}
}

// --- the reference -------------------------------------------------------

// Expected runs the reference over the shape's inputs: every output and
// dead letter the route must write, in no particular order. The live
// variants leave out what their flush records cause.
func (s *Shape) Expected() []Output {
	states := make([]*stepState, len(s.Steps))
	for i := range states {
		states[i] = &stepState{wins: map[int64]map[string]*acc{}, seen: map[string]int64{}, sess: map[string][]*refSession{}}
	}
	var outs []Output
	var run func(i int, r *rec)
	run = func(i int, r *rec) {
		if i == len(s.Steps) {
			topic := r.sink
			if topic == "" {
				topic = s.Sink
			}
			outs = append(outs, Output{Topic: topic, Key: string(r.key), Value: canonicalValue(r.val)})
			return
		}
		st := s.Steps[i]
		st.process(states[i], r, func(o *rec) { run(i+1, o) }, func(o *rec, reason string) {
			outs = append(outs, Output{DeadLetter: true, Reason: reason, Step: fmt.Sprintf("%d:%s", i, st.Kind),
				Key: string(o.key), Value: canonicalValue(o.val)})
		})
	}
	advance := func(wm int64) {
		for i, st := range s.Steps {
			if st.advance == nil {
				continue
			}
			if states[i].hasWM && wm <= states[i].wm {
				continue
			}
			states[i].hasWM, states[i].wm = true, wm
			st.advance(states[i], wm, func(o *rec) { run(i+1, o) })
		}
	}
	front := make([]int64, s.Partitions)
	seen := make([]bool, s.Partitions)
	var wm int64
	hasWM := false
	for _, in := range s.Inputs {
		var v any
		if err := json.Unmarshal(in.Value, &v); err != nil {
			outs = append(outs, Output{DeadLetter: true, Reason: "decode", Step: "source", Key: string(in.Key), Value: "raw:" + string(in.Value)})
			continue
		}
		m := v.(map[string]any)
		t, ok := m["ts"].(float64)
		if !ok {
			outs = append(outs, Output{DeadLetter: true, Reason: "error", Step: "source", Key: string(in.Key), Value: canonicalValue(v)})
			continue
		}
		ev := int64(t)
		run(0, &rec{key: in.Key, val: m, ev: ev})
		f := ev - s.Lateness
		if !seen[in.Partition] || f > front[in.Partition] {
			front[in.Partition], seen[in.Partition] = f, true
		}
		if !slices.Contains(seen, false) {
			if w := slices.Min(front); !hasWM || w > wm {
				wm, hasWM = w, true
				advance(wm)
			}
		}
	}
	defer func() {
		s.merges, s.capped = 0, 0
		for _, st := range states {
			s.merges += st.merges
			s.capped += st.capped
		}
	}()
	defer func() {
		s.switchDrops, s.switchDropsFlush = 0, 0
		for _, st := range states {
			s.switchDrops += st.drops
			s.switchDropsFlush += st.dropsFlush
		}
	}()
	if !s.Live {
		advance(s.Far)
		return outs
	}
	// The live variants: leave out what the flush records caused (their
	// own outputs and dead letters; their windows never close).
	kept := outs[:0]
	for _, o := range outs {
		if !strings.Contains(o.Value, `"`+FlushID) && !strings.HasPrefix(o.Key, FlushID) {
			kept = append(kept, o)
		}
	}
	return kept
}

// Diff compares what a run wrote with what the reference expects, as
// multisets; "" when equal.
func Diff(want, got []Output) string {
	count := map[string]int{}
	for _, o := range want {
		count[o.String()]++
	}
	for _, o := range got {
		count[o.String()]--
	}
	var lines []string
	for k, n := range count {
		switch {
		case n > 0:
			lines = append(lines, fmt.Sprintf("missing %d× %s", n, k))
		case n < 0:
			lines = append(lines, fmt.Sprintf("extra   %d× %s", -n, k))
		}
	}
	sort.Strings(lines)
	if len(lines) > 30 {
		lines = append(lines[:30], fmt.Sprintf("... and %d more", len(lines)-30))
	}
	return strings.Join(lines, "\n")
}

// Filter drops, for the live variants, what the flush records caused.
func (s *Shape) Filter(got []Output) []Output {
	if !s.Live {
		return got
	}
	var kept []Output
	for _, o := range got {
		if !strings.Contains(o.Value, `"`+FlushID) && !strings.HasPrefix(o.Key, FlushID) {
			kept = append(kept, o)
		}
	}
	return kept
}

// Describe is the shape for a failure message.
func (s *Shape) Describe() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "seed %d (live %v), %d partitions, %d inputs\n%s", s.Seed, s.Live, s.Partitions, len(s.Inputs), s.YAML())
	return b.String()
}

// --- running live --------------------------------------------------------

// RepartitionTopics are the shape's source topic and the repartition
// topics of its keyed steps, with their partitions (a route's group
// reads them all).
func (s *Shape) RepartitionTopics() map[string]int {
	m := map[string]int{s.Topic: s.Partitions}
	for i, st := range s.Steps {
		if st.Keyed {
			m[fmt.Sprintf("%s.%02d-%s.repartition", s.Name, i, st.Kind)] = s.Partitions
		}
	}
	return m
}

// RunLive produces the shape's inputs to the brokers at addrs and reads
// the sink and the dead-letter topic until they hold what the reference
// expects (or 60 s passed), then a little longer for extras.
func RunLive(t testing.TB, addrs []string, s *Shape) []Output {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var rs []*kgo.Record
	for _, in := range s.Inputs {
		rs = append(rs, &kgo.Record{Topic: s.Topic, Partition: in.Partition, Key: in.Key, Value: in.Value})
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer pcancel()
	if err := cl.ProduceSync(pctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	want := len(s.Expected())
	rd, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(append(s.SinkTopics(), s.DLQ)...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var got []Output
	read := func(d time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		rd.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			got = append(got, fromWritten(r.Topic, r.Topic == s.DLQ, r.Key, r.Value, func(k string) string {
				for _, h := range r.Headers {
					if h.Key == k {
						return string(h.Value)
					}
				}
				return ""
			}))
		})
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(s.Filter(got)) < want && time.Now().Before(deadline) {
		read(time.Second)
	}
	quiet := time.Now().Add(time.Second)
	for time.Now().Before(quiet) {
		read(200 * time.Millisecond)
	}
	return s.Filter(got)
}

// fromWritten is a written record in the form outputs are compared in.
func fromWritten(topic string, dl bool, key, value []byte, hdr func(string) string) Output {
	o := Output{DeadLetter: dl, Key: string(key), Value: Canonical(value)}
	if dl {
		o.Reason, o.Step = hdr(pipeline.HeaderReason), hdr(pipeline.HeaderStep)
	} else {
		o.Topic = topic
	}
	return o
}

// eventKey draws the key of a window over events (not rows): one of their
// two key fields, or a key made of two fields; the expression and how the
// reference computes it.
func eventKey(rng *rand.Rand) (string, func(*rec) string) {
	switch rng.IntN(3) {
	case 0:
		return "value.k1", func(r *rec) string { return r.obj()["k1"].(string) }
	case 1:
		return "value.k2", func(r *rec) string { return r.obj()["k2"].(string) }
	default:
		return `value.k1 + "-" + value.g`, func(r *rec) string { return r.obj()["k1"].(string) + "-" + r.obj()["g"].(string) }
	}
}

// --- the switch and the join before it ------------------------------------

// TableFile is the file of a shape's table `tb`, next to its rule file.
const TableFile = "tb.jsonl"

// genSwitch makes two shapes of three end in a switch of one to three
// branches with conditions on what the steps before emit (shape), maybe a
// default branch last, and keys of their own; half of those look records
// up in a table first (a join, with any `missing`) and branch on the
// row.
func genSwitch(s *Shape, rng *rand.Rand, shape shapeKind) {
	if rng.IntN(3) == 0 {
		return
	}
	joined := rng.IntN(2) == 0
	if !joined && rng.IntN(3) != 0 {
		// The switch right after the last keyed step (a window's,
		// a session's or drop_duplicates' task writes the sinks).
		for len(s.Steps) > 0 && !s.Steps[len(s.Steps)-1].Keyed {
			s.Steps = s.Steps[:len(s.Steps)-1]
		}
		// Or after the last window, when drop_duplicates follows it.
		if w := slices.IndexFunc(s.Steps, func(st Step) bool { return st.Kind == "window" }); w >= 0 && s.Steps[len(s.Steps)-1].Kind != "window" {
			last := w
			for i, st := range s.Steps {
				if st.Kind == "window" {
					last = i
				}
			}
			s.Steps = s.Steps[:last+1]
			shape = row
		}
	}
	if joined {
		s.Table = map[string]map[string]any{}
		var ids []string
		for i := range 3 {
			ids = append(ids, fmt.Sprint("k", i))
		}
		for i := range 8 {
			ids = append(ids, fmt.Sprint("q", i))
		}
		ids = append(ids, "all", "k1-y", "k2-x", "k0~")
		for _, id := range ids {
			s.Table[id] = map[string]any{"id": id, "tier": []string{"gold", "silver", "bronze"}[rng.IntN(3)], "w": float64(rng.IntN(10))}
		}
		s.Steps = append(s.Steps, joinStep(rng, shape, s.Table))
		if rng.IntN(2) == 0 {
			s.Steps = append(s.Steps, Step{YAML: `set: { tier: 'tb?.tier ?? "none"' }`, Kind: "set", live: true,
				process: func(_ *stepState, r *rec, emit func(*rec), _ func(*rec, string)) {
					m := copyObj(r.obj())
					m["tier"] = "none"
					if row, _ := r.bound["tb"].(map[string]any); row != nil {
						m["tier"] = row["tier"]
					}
					emit(&rec{key: r.key, val: m, ev: r.ev, bound: r.bound})
				}})
		}
	}
	n := 1 + rng.IntN(3)
	for i := range n {
		b := Branch{Topic: fmt.Sprintf("%s.b%d", s.Name, i+1)}
		if i < n-1 || rng.IntN(2) == 0 {
			b.When, b.when = branchWhen(rng, shape, joined)
		}
		b.Key, b.key = branchKey(rng, shape)
		s.Branches = append(s.Branches, b)
	}
	var parts []string
	for _, b := range s.Branches {
		var p []string
		if b.When != "" {
			p = append(p, fmt.Sprintf("when: '%s'", b.When))
		}
		sk := "topic: " + b.Topic
		if b.Key != "" {
			sk += fmt.Sprintf(", key: '%s'", b.Key)
		}
		p = append(p, "sink: { "+sk+" }")
		parts = append(parts, "{ "+strings.Join(p, ", ")+" }")
	}
	branches := s.Branches
	s.Steps = append(s.Steps, Step{YAML: "switch: [ " + strings.Join(parts, ", ") + " ]", Kind: "switch", live: true,
		process: func(st *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
			for _, b := range branches {
				if b.when != nil {
					ok, err := b.when(r)
					if err != nil {
						dl(r, "error")
						return
					}
					if !ok {
						continue
					}
				}
				key := r.key
				if b.key != nil {
					key = []byte(b.key(r))
				}
				emit(&rec{sink: b.Topic, key: key, val: r.val, ev: r.ev, bound: r.bound})
				return
			}
			st.drops++
			if strings.HasPrefix(string(r.key), FlushID) || strings.Contains(canonicalValue(r.val), `"`+FlushID) {
				st.dropsFlush++
			}
		}})
}

// joinStep looks events up by k1 or k2 and window rows by their key, and
// binds the row as tb; missing keep, drop or dead_letter (reason
// missing).
func joinStep(rng *rand.Rand, shape shapeKind, table map[string]map[string]any) Step {
	on, key := "value.key", func(r *rec) string { return r.obj()["key"].(string) }
	if shape == event {
		if rng.IntN(2) == 0 {
			on, key = "value.k1", func(r *rec) string { return r.obj()["k1"].(string) }
		} else {
			on, key = "value.k2", func(r *rec) string { return r.obj()["k2"].(string) }
		}
	}
	missing := []string{"keep", "drop", "dead_letter"}[rng.IntN(3)]
	return Step{YAML: fmt.Sprintf("join: { table: tb, on: %s, as: tb, missing: %s }", on, missing), Kind: "join", live: true,
		process: func(_ *stepState, r *rec, emit func(*rec), dl func(*rec, string)) {
			row, ok := table[key(r)]
			if !ok {
				switch missing {
				case "drop":
					return
				case "dead_letter":
					dl(r, "missing")
					return
				}
			}
			b := make(map[string]any, len(r.bound)+1)
			for k, v := range r.bound {
				b[k] = v
			}
			if ok {
				b["tb"] = row
			} else {
				b["tb"] = nil
			}
			emit(&rec{key: r.key, val: r.val, ev: r.ev, bound: b})
		}}
}

// branchWhen draws a branch's condition on what reaches the switch.
func branchWhen(rng *rand.Rand, shape shapeKind, joined bool) (string, func(*rec) (bool, error)) {
	if joined && rng.IntN(3) == 0 {
		tier := []string{"gold", "silver"}[rng.IntN(2)]
		return fmt.Sprintf(`tb?.tier == "%s"`, tier), func(r *rec) (bool, error) {
			row, _ := r.bound["tb"].(map[string]any)
			return row != nil && row["tier"] == tier, nil
		}
	}
	if shape == event {
		if rng.IntN(2) == 0 {
			g := []string{"x", "y", "z"}[rng.IntN(3)]
			return fmt.Sprintf(`value.g == "%s"`, g), func(r *rec) (bool, error) { return r.obj()["g"] == g, nil }
		}
		c := rng.IntN(50)
		return fmt.Sprintf("value.a > %d", c), func(r *rec) (bool, error) {
			a, err := num(r.obj()["a"])
			if err != nil {
				return false, err
			}
			return a > float64(c), nil
		}
	}
	if rng.IntN(2) == 0 {
		c := 1 + rng.IntN(3)
		return fmt.Sprintf("value.n >= %d", c), func(r *rec) (bool, error) { return r.obj()["n"].(float64) >= float64(c), nil }
	}
	c := rng.IntN(100)
	return fmt.Sprintf("value.s > %d", c), func(r *rec) (bool, error) { return r.obj()["s"].(float64) > float64(c), nil }
}

// branchKey draws a branch sink's key: the record's own (""), or a field
// of what reaches the switch.
func branchKey(rng *rand.Rand, shape shapeKind) (string, func(*rec) string) {
	switch {
	case rng.IntN(2) == 0:
		return "", nil
	case shape == event && rng.IntN(2) == 0:
		return "value.g", func(r *rec) string { return r.obj()["g"].(string) }
	case shape == event:
		return `value.k2 + "/" + value.id`, func(r *rec) string { return r.obj()["k2"].(string) + "/" + r.obj()["id"].(string) }
	}
	return `"b-" + value.key`, func(r *rec) string { return "b-" + r.obj()["key"].(string) }
}

// SinkTopics are the topics the shape's route writes its outputs to: its
// switch's branches', or its sink.
func (s *Shape) SinkTopics() []string {
	if s.Branches == nil {
		return []string{s.Sink}
	}
	var ts []string
	for _, b := range s.Branches {
		ts = append(ts, b.Topic)
	}
	return ts
}

// Files are the files the rule file names (its table), by name, to be
// written next to it.
func (s *Shape) Files() map[string]string {
	if s.Table == nil {
		return nil
	}
	ids := make([]string, 0, len(s.Table))
	for id := range s.Table {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var b strings.Builder
	for _, id := range ids {
		j, _ := json.Marshal(s.Table[id])
		b.Write(j)
		b.WriteByte('\n')
	}
	return map[string]string{TableFile: b.String()}
}

// Seam names the step a shape's switch follows: the kind of the step
// before it (a window of a session shape is "session"), "" without a
// switch.
func (s *Shape) Seam() string {
	n := len(s.Steps)
	if s.Branches == nil || n < 2 {
		return ""
	}
	k := s.Steps[n-2].Kind
	if k == "window" && s.Sessions {
		return "session"
	}
	return k
}

// SwitchDrops is how many records no branch of the switch took, as
// Expected last counted them; flush how many of them the live variants'
// flush records caused.
func (s *Shape) SwitchDrops() (all, flush int) { return s.switchDrops, s.switchDropsFlush }
