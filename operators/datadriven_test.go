package operators

// Golden tests: testdata/<operator> files are run with
// github.com/cockroachdb/datadriven. Directives:
//
//	table name=N key=F            rows (JSON lines) of a MapTable named N keyed by field F
//	table name=N key=F file=P     a FileTable loaded from P (relative to testdata/)
//	build [bound=a,b]             one step in rule-file YAML; prints "ok" or the error
//	process                       one record per line (see parseRecord); prints what came out
//	advance wm=N                  moves the watermark; prints what came out
//	kv                            dumps the step's state.KV (drop_duplicates)
//	snapshot                      dumps the step's snapshot (windows)
//	restore                       snapshots, builds a fresh step, restores into it and uses it
//
// Set -rewrite to regenerate expected output after a deliberate change.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// collect is an Emitter that records what a step produced.
type collect struct {
	out   []*Record
	lines []string
}

func (c *collect) Emit(r *Record) {
	c.out = append(c.out, r)
	c.lines = append(c.lines, "emit "+formatRecord(r))
}

func (c *collect) DeadLetter(r *Record, reason Reason, err error) {
	c.lines = append(c.lines, fmt.Sprintf("dead reason=%s key=%s: %v", reason, r.Key, err))
}

func (c *collect) String() string {
	if len(c.lines) == 0 {
		return "(nothing)\n"
	}
	return strings.Join(c.lines, "\n") + "\n"
}

func formatRecord(r *Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "key=%s t=%d", r.Key, r.EventTime)
	v, err := jsoncodec.Append(nil, r.Value)
	if err != nil {
		v = []byte(err.Error())
	}
	fmt.Fprintf(&b, " value=%s", v)
	if len(r.Bound) > 0 {
		bb, _ := jsoncodec.Append(nil, r.Bound)
		fmt.Fprintf(&b, " bound=%s", bb)
	}
	if r.Window != nil {
		fmt.Fprintf(&b, " window=[%d,%d)", r.Window.Start, r.Window.End)
	}
	for _, h := range r.Headers {
		fmt.Fprintf(&b, " header[%s]=%s", h.Key, h.Value)
	}
	return b.String()
}

// inRecord is the JSON form of a test input record. "t" is both the event
// time and the Kafka timestamp; "raw" without "value" gives a raw record.
type inRecord struct {
	Key     string            `json:"key"`
	T       int64             `json:"t"`
	Value   json.RawMessage   `json:"value"`
	Raw     *string           `json:"raw"`
	Headers map[string]string `json:"headers"`
	Offset  int64             `json:"offset"`
}

func parseRecord(line string) (*Record, error) {
	var in inRecord
	if err := json.Unmarshal([]byte(line), &in); err != nil {
		return nil, fmt.Errorf("bad test record %q: %v", line, err)
	}
	r := &Record{Topic: "in", Key: []byte(in.Key), Timestamp: in.T, EventTime: in.T, Offset: in.Offset}
	switch {
	case in.Value != nil:
		v, err := jsoncodec.Decode(in.Value)
		if err != nil {
			return nil, err
		}
		r.Value, r.Raw = v, in.Value
	case in.Raw != nil:
		r.Value, r.Raw = *in.Raw, []byte(*in.Raw)
	}
	keys := make([]string, 0, len(in.Headers))
	for k := range in.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		r.Headers = append(r.Headers, Header{Key: k, Value: []byte(in.Headers[k])})
	}
	return r, nil
}

// buildStep builds one step from its rule-file YAML through the step's
// Spec, as package rules does (rules imports operators, so it cannot be
// used here). It reads each key by its declared type and fills in the
// declared defaults; the analyzer's refusals (names, scope) are rules'
// own tests.
func buildStep(src string, bound []string, tables map[string]Table, kv *MemKV) (Step, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode || len(doc.Content[0].Content) != 2 {
		return nil, fmt.Errorf("want one `kind: spec` mapping")
	}
	kind, node := doc.Content[0].Content[0].Value, doc.Content[0].Content[1]
	spec := SpecOf(kind)
	if spec == nil {
		return nil, fmt.Errorf("unknown step %q", kind)
	}
	given := map[string]*yaml.Node{}
	if spec.Body != nil {
		given[kind] = node
	} else {
		for i := 0; i+1 < len(node.Content); i += 2 {
			given[node.Content[i].Value] = node.Content[i+1]
		}
	}
	keys := spec.Keys
	if spec.Body != nil {
		keys = []Key{*spec.Body}
	}
	args := NewArgs()
	for _, k := range keys {
		n := given[k.Name]
		text := k.Default
		if n != nil {
			text = n.Value
		} else if k.DefaultFrom != "" {
			text = given[k.DefaultFrom].Value
		}
		if n == nil && text == "" {
			continue
		}
		var v any
		switch k.Type {
		case TypeExpr, TypeCondition:
			e, err := CompileExpr(text, bound)
			if err != nil {
				return nil, err
			}
			v = e
		case TypeDuration:
			d, err := time.ParseDuration(text)
			if err != nil {
				return nil, err
			}
			v = d
		case TypeFields:
			var fs []Field
			for i := 0; i+1 < len(n.Content); i += 2 {
				e, err := CompileExpr(n.Content[i+1].Value, bound)
				if err != nil {
					return nil, err
				}
				fs = append(fs, Field{Name: n.Content[i].Value, Expr: e})
			}
			v = fs
		case TypeAggregates:
			var aggs []Aggregate
			for i := 0; i+1 < len(n.Content); i += 2 {
				a, err := parseAggregate(n.Content[i].Value, n.Content[i+1].Value, bound)
				if err != nil {
					return nil, err
				}
				aggs = append(aggs, a)
			}
			v = aggs
		default:
			v = text
		}
		args.Set(k.Name, v, n != nil)
	}
	plan, err := spec.Compile(args)
	if err != nil {
		return nil, err
	}
	return plan.New(BuildEnv{KV: kv, Tables: tables})
}

var aggCall = regexp.MustCompile(`^\s*([a-z_]+)\((.*)\)\s*$`)

func parseAggregate(name, src string, bound []string) (Aggregate, error) {
	m := aggCall.FindStringSubmatch(src)
	if m == nil || !IsAggregate(m[1]) {
		return Aggregate{}, fmt.Errorf("%s: %q is not an aggregate call", name, src)
	}
	a := Aggregate{Name: name, Func: AggFunc(m[1])}
	if strings.TrimSpace(m[2]) != "" {
		e, err := CompileExpr(m[2], bound)
		if err != nil {
			return Aggregate{}, err
		}
		a.Arg = e
	}
	return a, nil
}

// snapWriter / snapReader are a snapshot in memory, in Put order.
type snapWriter struct{ keys, vals [][]byte }

func (s *snapWriter) Put(k, v []byte) error {
	s.keys = append(s.keys, slices.Clone(k))
	s.vals = append(s.vals, slices.Clone(v))
	return nil
}

// sort orders the entries by key, as a store would hold them (a step may
// Put them in any order).
func (s *snapWriter) sort() {
	idx := make([]int, len(s.keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return bytes.Compare(s.keys[a], s.keys[b]) })
	keys, vals := make([][]byte, len(idx)), make([][]byte, len(idx))
	for i, j := range idx {
		keys[i], vals[i] = s.keys[j], s.vals[j]
	}
	s.keys, s.vals = keys, vals
}

func (s *snapWriter) Each(fn func(k, v []byte) error) error {
	for i := range s.keys {
		if err := fn(s.keys[i], s.vals[i]); err != nil {
			return err
		}
	}
	return nil
}

func TestGolden(t *testing.T) {
	datadriven.Walk(t, "testdata/golden", func(t *testing.T, path string) {
		var (
			step    Step
			stepSrc string
			bound   []string
			kv      *MemKV
			tables  = map[string]Table{}
		)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "table":
				var name, key string
				d.ScanArgs(t, "name", &name)
				d.ScanArgs(t, "key", &key)
				if d.HasArg("file") {
					var file string
					d.ScanArgs(t, "file", &file)
					ft, err := LoadFileTable(filepath.Join("testdata", file), key)
					if err != nil {
						return "error: " + err.Error() + "\n"
					}
					tables[name] = ft
					return fmt.Sprintf("loaded %d rows\n", ft.Len())
				}
				mt := NewMapTable()
				for _, line := range strings.Split(d.Input, "\n") {
					v, err := jsoncodec.Decode([]byte(line))
					if err != nil {
						t.Fatal(err)
					}
					row := v.(map[string]any)
					k, _ := keyString(row[key])
					mt.Set(k, row)
				}
				tables[name] = mt
				return fmt.Sprintf("%d rows\n", mt.Len())
			case "build":
				bound = nil
				if d.HasArg("bound") {
					var b string
					d.ScanArgs(t, "bound", &b)
					bound = strings.Split(b, ",")
				}
				kv = NewMemKV()
				stepSrc = d.Input
				s, err := buildStep(d.Input, bound, tables, kv)
				if err != nil {
					step = nil
					return "error: " + err.Error() + "\n"
				}
				step = s
				return "ok\n"
			case "process":
				var c collect
				for _, line := range strings.Split(d.Input, "\n") {
					r, err := parseRecord(line)
					if err != nil {
						t.Fatal(err)
					}
					if ks, ok := step.(Keyed); ok {
						if _, err := ks.ShuffleKey(r); err != nil {
							c.lines = append(c.lines, fmt.Sprintf("shuffle error key=%s: %v", r.Key, err))
							continue
						}
					}
					step.Process(r, &c)
				}
				return c.String()
			case "advance":
				var wm int64
				d.ScanArgs(t, "wm", &wm)
				var c collect
				// A step that is not Timed never sees the watermark (the
				// pipeline does not call it): advancing it does nothing.
				if ts, ok := step.(Timed); ok {
					ts.Advance(wm, &c)
				}
				return c.String()
			case "kv":
				var b strings.Builder
				_ = kv.Scan(nil, nil, func(k, v []byte) bool {
					switch k[0] {
					case 'k':
						if len(v) == 8 {
							fmt.Fprintf(&b, "k %s -> %d\n", k[1:], getTime(v))
						} else {
							fmt.Fprintf(&b, "k %s\n", k[1:])
						}
					case 't':
						fmt.Fprintf(&b, "t %d %s\n", getTime(k[1:9]), k[9:])
					}
					return true
				})
				if b.Len() == 0 {
					return "(empty)\n"
				}
				return b.String()
			case "snapshot":
				var sw snapWriter
				if err := step.(Stateful).Snapshot(&sw); err != nil {
					return "error: " + err.Error() + "\n"
				}
				sw.sort()
				var b strings.Builder
				for i := range sw.keys {
					fmt.Fprintf(&b, "%q -> %x\n", sw.keys[i], sw.vals[i])
				}
				return b.String()
			case "restore":
				var sw snapWriter
				if err := step.(Stateful).Snapshot(&sw); err != nil {
					return "error: " + err.Error() + "\n"
				}
				fresh, err := buildStep(stepSrc, bound, tables, kv)
				if err != nil {
					t.Fatal(err)
				}
				if err := fresh.(Stateful).Restore(&sw); err != nil {
					return "error: " + err.Error() + "\n"
				}
				var again snapWriter
				_ = fresh.(Stateful).Snapshot(&again)
				sw.sort()
				again.sort()
				if !slices.EqualFunc(sw.keys, again.keys, slices.Equal) || !slices.EqualFunc(sw.vals, again.vals, slices.Equal) {
					return "snapshot after restore differs\n"
				}
				step = fresh
				return fmt.Sprintf("restored %d entries\n", len(sw.keys))
			}
			t.Fatalf("unknown directive %q", d.Cmd)
			return ""
		})
	})
}
