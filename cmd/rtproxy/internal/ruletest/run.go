package ruletest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/rules"
)

// Result is the outcome of one test.
type Result struct {
	Test    *Test
	Elapsed time.Duration
	// Failures are readable explanations, each starting with the test
	// file's file:line it is about; none when the test passed.
	Failures []string
}

// Run runs one test against route def.
func Run(f *File, t *Test, def *rules.Route) (res Result) {
	start := time.Now()
	res.Test = t
	fail := func(line int, format string, args ...any) {
		res.Failures = append(res.Failures, fmt.Sprintf("%s:%d: ", f.Path, line)+fmt.Sprintf(format, args...))
	}
	defer func() { res.Elapsed = time.Since(start) }()
	if def.View != nil {
		runView(t, def, fail)
		return res
	}
	if t.Client != nil {
		fail(t.Client.Line, "`client:` says who fetches a view; route %q is not a view", def.Name)
		return res
	}
	if t.Expect.Records != nil {
		fail(t.Expect.Line, "expect.records is what a view's client fetches; route %q writes `sink:` and `dead_letters:`", def.Name)
		return res
	}

	parts := t.Partitions
	if parts == 0 {
		for _, s := range t.Steps {
			if s.Input != nil {
				parts = max(parts, int(s.Input.Partition)+1)
			}
		}
	}
	tables := map[string]operators.Table{}
	for name, rows := range t.Tables {
		spec, ok := def.Tables[name]
		if !ok {
			fail(rows.Line, "route %q has no table %q", def.Name, name)
			return res
		}
		mt := operators.NewMapTable()
		for k, row := range rows.ByKey {
			mt.Set(k, row)
		}
		for _, row := range rows.List {
			if spec.Key == "" {
				fail(rows.Line, "table %q is read from topic %s, whose rows are keyed by the record key: give its rows as a mapping from key to row", name, spec.Topic)
				return res
			}
			k, ok := tableKey(row[spec.Key])
			if !ok {
				fail(rows.Line, "table %q: a row has no usable key field %q", name, spec.Key)
				return res
			}
			mt.Set(k, row)
		}
		tables[name] = mt
	}
	d, err := pipeline.NewDriver(def, pipeline.DriverConfig{Partitions: parts, Tables: tables})
	if err != nil {
		fail(t.Line, "cannot run route %q: %v", def.Name, err)
		return res
	}
	defer d.Close()
	for _, s := range t.Steps {
		switch {
		case s.Input != nil:
			in, err := driverInput(s.Input)
			if err == nil {
				if s.Input.Topic != "" {
					// A record of a stream join's second topic (or, named,
					// of the source).
					err = d.SendTo(s.Input.Topic, in)
				} else {
					err = d.Send(in)
				}
			}
			if err != nil {
				fail(s.Line, "input record: %v", err)
				return res
			}
		case s.Watermark != nil:
			d.AdvanceWatermark(*s.Watermark)
		default:
			d.AdvanceIdle(s.Idle)
		}
	}
	if e := d.Errors(); e != "" {
		fail(t.Line, "the route reported an error: %s", e)
	}
	var sink, dls []pipeline.DriverOutput
	for _, o := range d.Outputs() {
		if o.DeadLetter {
			dls = append(dls, o)
		} else {
			sink = append(sink, o)
		}
	}
	if def.Switch != nil || t.Expect.Sinks != nil {
		compareSinks(fail, t.Expect, def, sink)
	} else {
		compare(fail, t.Expect, "sink", t.Expect.Sink, sink, false)
	}
	compare(fail, t.Expect, "dead_letters", t.Expect.DeadLetters, dls, true)
	return res
}

// compareSinks checks what a route wrote to each of its sinks against
// expect.sinks, sink by sink; a sink the file does not name must receive
// nothing.
func compareSinks(fail func(int, string, ...any), e Expect, def *rules.Route, got []pipeline.DriverOutput) {
	sinks := def.Sinks()
	names := make([]string, len(sinks))
	byTarget := map[string]string{}
	for i, s := range sinks {
		names[i] = s.Name
		byTarget[s.Target()] = s.Name
	}
	if e.Sink != nil {
		fail(e.Line, "route %q writes to %d sinks (its switch): give what each receives under `expect.sinks`, by sink (%s), not `expect.sink`", def.Name, len(sinks), strings.Join(names, ", "))
		return
	}
	for _, n := range e.SinkNames {
		if !slices.Contains(names, n) {
			fail(e.SinksLine, "expect.sinks names %q, which is no sink of route %q; its sinks are %s", n, def.Name, strings.Join(names, ", "))
		}
	}
	per := map[string][]pipeline.DriverOutput{}
	for _, o := range got {
		n := byTarget[o.Topic]
		per[n] = append(per[n], o)
	}
	for _, n := range names {
		compare(fail, e, "sinks."+n, e.Sinks[n], per[n], false)
	}
}

func tableKey(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

// driverInput turns an input record of the file into the driver's.
func driverInput(r *Record) (pipeline.DriverInput, error) {
	in := pipeline.DriverInput{Partition: r.Partition, Offset: r.Offset}
	if r.Key != nil {
		in.Key = []byte(*r.Key)
	}
	switch v := r.Value.(type) {
	case nil:
	case string:
		in.Value = []byte(v)
	default:
		b, err := jsoncodec.Append(nil, v)
		if err != nil {
			return in, err
		}
		in.Value = b
	}
	names := make([]string, 0, len(r.Headers))
	for k := range r.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		in.Headers = append(in.Headers, operators.Header{Key: k, Value: []byte(r.Headers[k])})
	}
	if r.Timestamp != nil {
		in.Timestamp = *r.Timestamp
	}
	return in, nil
}

// compare checks what the route wrote to one topic against the
// expectation: in order, or as a set with order: any.
func compare(fail func(int, string, ...any), e Expect, what string, want []*Record, got []pipeline.DriverOutput, dlq bool) {
	compareWith(fail, e, what, want, got, dlq, pipeline.HeaderError)
}

// compareWith is compare with the header an expected record's `error:`
// is matched against.
func compareWith(fail func(int, string, ...any), e Expect, what string, want []*Record, got []pipeline.DriverOutput, dlq bool, errHeader string) {
	if want == nil && len(got) == 0 {
		return
	}
	if want == nil {
		var b strings.Builder
		for i, o := range got {
			fmt.Fprintf(&b, "\n    got %d: %s", i+1, describe(o, dlq))
		}
		fail(e.Line, "expect.%s is not given, so none are expected, but the route wrote %d:%s", what, len(got), b.String())
		return
	}
	if !e.AnyOrder {
		n := max(len(want), len(got))
		for i := range n {
			switch {
			case i >= len(got):
				fail(want[i].Line, "%s record %d was expected but not written:\n    want: %s", what, i+1, describeWant(want[i]))
			case i >= len(want):
				fail(e.Line, "%s record %d was written but not expected:\n    got:  %s", what, i+1, describe(got[i], dlq))
			default:
				if diffs := match(want[i], got[i], errHeader); len(diffs) > 0 {
					fail(want[i].Line, "%s record %d differs:\n    %s\n    want: %s\n    got:  %s",
						what, i+1, strings.Join(diffs, "\n    "), describeWant(want[i]), describe(got[i], dlq))
				}
			}
		}
		return
	}
	// As a set: the most expected records matched to written ones (a
	// bipartite matching, so a loose expectation cannot take the only
	// record a stricter one fits), then each expected record left over is
	// shown against its nearest written record left over, field by field.
	fits := make([][]bool, len(want))
	for i, w := range want {
		fits[i] = make([]bool, len(got))
		for j, g := range got {
			fits[i][j] = len(match(w, g, errHeader)) == 0
		}
	}
	owner := make([]int, len(got)) // got j -> the want it is matched to, or -1
	for j := range owner {
		owner[j] = -1
	}
	var augment func(i int, seen []bool) bool
	augment = func(i int, seen []bool) bool {
		for j := range got {
			if fits[i][j] && !seen[j] {
				seen[j] = true
				if owner[j] < 0 || augment(owner[j], seen) {
					owner[j] = i
					return true
				}
			}
		}
		return false
	}
	matched := make([]bool, len(want))
	for i := range want {
		matched[i] = augment(i, make([]bool, len(got)))
	}
	used := make([]bool, len(got))
	for j, i := range owner {
		used[j] = i >= 0
	}
	for i, w := range want {
		if matched[i] {
			continue
		}
		near, nearDiffs := -1, []string(nil)
		for j, g := range got {
			if used[j] {
				continue
			}
			if d := match(w, g, errHeader); near < 0 || len(d) < len(nearDiffs) {
				near, nearDiffs = j, d
			}
		}
		if near < 0 {
			fail(w.Line, "no written %s record matches this expected one (order: any), and every written one is matched to another:\n    want: %s", what, describeWant(w))
			continue
		}
		used[near] = true
		fail(w.Line, "no written %s record matches this expected one (order: any); the nearest, written %d, differs:\n    %s\n    want: %s\n    got:  %s",
			what, near+1, strings.Join(nearDiffs, "\n    "), describeWant(w), describe(got[near], dlq))
	}
	for j, g := range got {
		if !used[j] {
			fail(e.Line, "%s record %d was written but matches no expected one (order: any):\n    got:  %s", what, j+1, describe(g, dlq))
		}
	}
}

// match lists how got differs from w, field by field; nil when it matches.
func match(w *Record, got pipeline.DriverOutput, errHeader string) []string {
	var diffs []string
	switch {
	case w.NullKey && got.Key != nil:
		diffs = append(diffs, fmt.Sprintf("key: want null, got %q", got.Key))
	case w.Key != nil && (got.Key == nil || string(got.Key) != *w.Key):
		g := "null"
		if got.Key != nil {
			g = strconv.Quote(string(got.Key))
		}
		diffs = append(diffs, fmt.Sprintf("key: want %q, got %s", *w.Key, g))
	}
	if w.HasValue {
		diffs = append(diffs, valueDiffs(w.Value, got.Value)...)
	}
	hs := map[string]string{}
	for _, h := range got.Headers {
		hs[h.Key] = string(h.Value)
	}
	names := make([]string, 0, len(w.Headers))
	for k := range w.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if g, ok := hs[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("header %s: want %q, not present", k, w.Headers[k]))
		} else if g != w.Headers[k] {
			diffs = append(diffs, fmt.Sprintf("header %s: want %q, got %q", k, w.Headers[k], g))
		}
	}
	if w.Timestamp != nil && !w.Timestamp.Equal(got.Timestamp) {
		diffs = append(diffs, fmt.Sprintf("timestamp: want %s, got %s", fmtTime(*w.Timestamp), fmtTime(got.Timestamp)))
	}
	if w.Window != nil {
		want := fmt.Sprintf("%d-%d", w.Window[0], w.Window[1])
		if g := hs[pipeline.HeaderWindow]; g != want {
			diffs = append(diffs, fmt.Sprintf("window: want %s, got %s", fmtWindow(want), fmtWindow(g)))
		}
	}
	if w.Reason != "" && hs[pipeline.HeaderReason] != w.Reason {
		diffs = append(diffs, fmt.Sprintf("reason: want %q, got %q", w.Reason, hs[pipeline.HeaderReason]))
	}
	if w.Step != "" && hs[pipeline.HeaderStep] != w.Step {
		diffs = append(diffs, fmt.Sprintf("step: want %q, got %q", w.Step, hs[pipeline.HeaderStep]))
	}
	if w.Error != "" && !strings.Contains(hs[errHeader], w.Error) {
		g := strconv.Quote(hs[errHeader])
		if _, ok := hs[errHeader]; !ok {
			g = "none (not an error)"
		}
		diffs = append(diffs, fmt.Sprintf("error: want it to contain %q, got %s", w.Error, g))
	}
	return diffs
}

// valueDiffs compares an expected value with the bytes written. A string
// is compared with the bytes as text (or with a JSON string); anything
// else with the bytes decoded as JSON, member by member.
func valueDiffs(want any, got []byte) []string {
	if want == nil {
		if got == nil || string(got) == "null" {
			return nil
		}
		return []string{fmt.Sprintf("value: want null, got %s", short(got))}
	}
	if s, ok := want.(string); ok {
		if string(got) == s {
			return nil
		}
		if v, err := jsoncodec.Decode(got); err == nil && v == any(s) {
			return nil
		}
		return []string{fmt.Sprintf("value: want %q, got %s", s, short(got))}
	}
	if got == nil {
		return []string{"value: want " + render(want) + ", got null (a tombstone)"}
	}
	g, err := jsoncodec.Decode(got)
	if err != nil {
		return []string{fmt.Sprintf("value: want %s, got bytes that are not JSON: %s", render(want), short(got))}
	}
	var out []string
	diffValue("value", want, g, &out)
	return out
}

func diffValue(path string, w, g any, out *[]string) {
	switch wv := w.(type) {
	case map[string]any:
		gv, ok := g.(map[string]any)
		if !ok {
			*out = append(*out, fmt.Sprintf("%s: want %s, got %s", path, render(w), render(g)))
			return
		}
		keys := make([]string, 0, len(wv)+len(gv))
		for k := range wv {
			keys = append(keys, k)
		}
		for k := range gv {
			if _, ok := wv[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			wk, inW := wv[k]
			gk, inG := gv[k]
			switch {
			case !inG:
				*out = append(*out, fmt.Sprintf("%s.%s: want %s, missing", path, k, render(wk)))
			case !inW:
				*out = append(*out, fmt.Sprintf("%s.%s: not expected, got %s", path, k, render(gk)))
			default:
				diffValue(path+"."+k, wk, gk, out)
			}
		}
	case []any:
		gv, ok := g.([]any)
		if !ok || len(gv) != len(wv) {
			*out = append(*out, fmt.Sprintf("%s: want %s, got %s", path, render(w), render(g)))
			return
		}
		for i := range wv {
			diffValue(fmt.Sprintf("%s[%d]", path, i), wv[i], gv[i], out)
		}
	case float64:
		if gf, ok := g.(float64); ok && (gf == wv || math.Abs(gf-wv) <= 1e-9*math.Max(math.Abs(wv), 1)) {
			return
		}
		*out = append(*out, fmt.Sprintf("%s: want %s, got %s", path, render(w), render(g)))
	default:
		if w != g {
			*out = append(*out, fmt.Sprintf("%s: want %s, got %s", path, render(w), render(g)))
		}
	}
}

func render(v any) string {
	b, err := jsoncodec.Append(nil, v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func short(b []byte) string {
	const max = 200
	if b == nil {
		return "null"
	}
	s := string(b)
	if len(s) > max {
		s = s[:max] + "…"
	}
	if json.Valid(b) {
		return s
	}
	return strconv.Quote(s)
}

func fmtTime(t time.Time) string {
	return fmt.Sprintf("%s (%d)", t.UTC().Format(time.RFC3339Nano), t.UnixMilli())
}

func fmtWindow(h string) string {
	if h == "" {
		return "(no rtproxy-window header: not a window row)"
	}
	s, e, _ := strings.Cut(h, "-")
	si, err1 := strconv.ParseInt(s, 10, 64)
	ei, err2 := strconv.ParseInt(e, 10, 64)
	if err1 != nil || err2 != nil {
		return h
	}
	return fmt.Sprintf("[%s, %s)", time.UnixMilli(si).UTC().Format(time.RFC3339), time.UnixMilli(ei).UTC().Format(time.RFC3339))
}

// describe renders a written record on one line.
func describe(o pipeline.DriverOutput, dlq bool) string {
	var b bytes.Buffer
	b.WriteString("{key: ")
	if o.Key == nil {
		b.WriteString("null")
	} else {
		b.WriteString(strconv.Quote(string(o.Key)))
	}
	b.WriteString(", value: ")
	b.WriteString(short(o.Value))
	for _, h := range o.Headers {
		switch {
		case h.Key == pipeline.HeaderWindow:
			b.WriteString(", window: " + fmtWindow(string(h.Value)))
		case dlq && (h.Key == pipeline.HeaderReason || h.Key == pipeline.HeaderStep || h.Key == pipeline.HeaderError):
			fmt.Fprintf(&b, ", %s: %q", strings.TrimPrefix(h.Key, "rtproxy-"), h.Value)
		case dlq && h.Key == rules.ViewErrorHeader:
			fmt.Fprintf(&b, ", error: %q", h.Value)
		case dlq && h.Key == detailHeader:
			fmt.Fprintf(&b, " (the client is not told: %q)", h.Value)
		case strings.HasPrefix(h.Key, "rtproxy-"):
		default:
			fmt.Fprintf(&b, ", header %s: %q", h.Key, h.Value)
		}
	}
	fmt.Fprintf(&b, ", timestamp: %d}", o.Timestamp.UnixMilli())
	return b.String()
}

// describeWant renders an expected record on one line.
func describeWant(w *Record) string {
	var parts []string
	switch {
	case w.NullKey:
		parts = append(parts, "key: null")
	case w.Key != nil:
		parts = append(parts, "key: "+strconv.Quote(*w.Key))
	}
	if w.HasValue {
		if s, ok := w.Value.(string); ok {
			parts = append(parts, "value: "+strconv.Quote(s))
		} else {
			parts = append(parts, "value: "+render(w.Value))
		}
	}
	if w.Window != nil {
		parts = append(parts, "window: "+fmtWindow(fmt.Sprintf("%d-%d", w.Window[0], w.Window[1])))
	}
	for _, kv := range [][2]string{{"reason", w.Reason}, {"step", w.Step}, {"error", w.Error}} {
		if kv[1] != "" {
			parts = append(parts, fmt.Sprintf("%s: %q", kv[0], kv[1]))
		}
	}
	names := make([]string, 0, len(w.Headers))
	for k := range w.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("header %s: %q", k, w.Headers[k]))
	}
	if w.Timestamp != nil {
		parts = append(parts, fmt.Sprintf("timestamp: %d", w.Timestamp.UnixMilli()))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
