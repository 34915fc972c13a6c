package operators

// Window snapshot layout (Snapshot / Restore), byte by byte. All integers
// are big-endian unless "uvarint"; a "time" is 8 bytes big-endian with the
// sign bit flipped so that byte order is time order (putTime).
//
//	key "m"  (written first)
//	  [0]      version = 1
//	  [1]      1 if a watermark has been seen, else 0
//	  [2:10]   watermark (time)
//	  uvarint  number of aggregates, then per aggregate: uvarint len + func
//	           name; Restore refuses a snapshot whose aggregates differ
//
//	key "w" <end: time> <window key bytes>   (one per open window, written
//	                                          in key order: by end, then key)
//	  per aggregate, in spec order (its encode / decode in aggregate.go):
//	    count          uvarint n
//	    sum            8 bytes float64 bits
//	    avg            8 bytes float64 bits (sum), uvarint n
//	    min, max       kind byte: 0 none | 1 number + 8 bytes float64 bits |
//	                   2 string + uvarint len + bytes
//	    first, last    kind byte: 0 none | 1 + time of the record + uvarint
//	                   len + JSON of the value
//	    count_distinct uvarint count, then each member (uvarint len + bytes)
//	                   in byte order
//
// The window start is not stored: it is always end - size.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

func init() {
	register(&Spec{
		Kind:    "window",
		Order:   60,
		Summary: "Groups records by key and event time into tumbling, sliding or session windows and emits one row of aggregates per key and window; later steps see the rows.",
		Keys: []Key{
			{Name: "kind", Type: TypeEnum, Required: true, Choices: WindowKinds,
				Doc:   "`tumbling`: windows `[k·size, (k+1)·size)`, each record in one. `sliding`: windows start every `slide`. `session`: a key's records less than `gap` apart, merged as they come (see Session windows).",
				Needs: "tumbling, sliding or session"},
			{Name: "size", Type: TypeDuration, Absent: "tumbling, sliding: required", Doc: "Tumbling and sliding windows: how long each window is; aligned to the epoch.",
				Needs: "how long each window is, e.g. `size: 5m`"},
			{Name: "slide", Type: TypeDuration, Absent: "sliding: required",
				Doc: "Sliding windows only: how far apart windows start, at most `size`, and at most 10,000 windows per record."},
			{Name: "gap", Type: TypeDuration, Absent: "session: required", FingerprintOmitsAbsent: true,
				Doc:   "Session windows only: a session ends after `gap` of event time without a record of its key; a record less than `gap` from a session joins it.",
				Needs: "the pause that ends a session, e.g. `gap: 30m`"},
			{Name: "max_duration", Type: TypeDuration, Absent: "no limit", FingerprintOmitsAbsent: true,
				Doc: "Session windows only: the longest a session may span, at least `gap`; a session that reaches it ends at `window_start + max_duration` and the key's next record starts a new one."},
			{Name: "key", Type: TypeExpr, Absent: "one window for the whole stream", Doc: "What groups records into windows."},
			{Name: "emit", Type: TypeEnum, Default: "on_close", Choices: []string{"on_close", "on_update"},
				Doc: "`on_close`: a row once, when the watermark passes the window's end. `on_update`: the current row on every change."},
			{Name: "aggregate", Type: TypeAggregates, Required: true,
				Doc:   "The row's values, each `NAME: AGGREGATE(...)` (see Aggregates).",
				Needs: "the values each window computes, e.g. `aggregate: { n: count(), total: sum(value.amount) }`"},
		},
		KeyedBy: "key",
		Usage:   "`window: { kind: tumbling, size: 1m, key: value.user_id, aggregate: { n: count() } }`",
		Example: `route: clicks-per-minute
source: { topic: clicks, event_time: value.ts, watermark: 5s }
sink: { topic: clicks.per-minute }
steps:
  - window: { kind: tumbling, size: 1m, key: value.page, aggregate: { views: count() } }
`,
		Compile: compileWindow,
	})
}

// windowRowFields are the fields every window row has besides its
// aggregates.
var windowRowFields = []string{"key", "window_start", "window_end"}

func compileWindow(a *Args) (*Plan, error) {
	ws := WindowSpec{
		Kind: a.String("kind"), Size: a.Duration("size"), Slide: a.Duration("slide"),
		Gap: a.Duration("gap"), MaxDuration: a.Duration("max_duration"),
		Key: a.Expr("key"), Aggregates: a.Aggregates("aggregate"),
		EmitOnUpdate: a.String("emit") == "on_update",
	}
	var errs KeyErrors
	// A key the kind needs and the file lacks is reported as a missing
	// required key is; the problems of the values follow.
	session := ws.Kind == "session"
	need := map[string]string{"size": "how long each window is, e.g. `size: 5m`"}
	if session {
		need = map[string]string{"gap": "the pause that ends a session, e.g. `gap: 30m`"}
	}
	for _, k := range []string{"size", "gap"} {
		if msg, ok := need[k]; ok && !a.Written(k) {
			errs = append(errs, &KeyError{Key: k, Msg: fmt.Sprintf("window needs `%s`: %s", k, msg)})
		}
	}
	if len(errs) == 0 {
		var problems WindowErrors
		errors.As(ws.Validate(), &problems)
		for _, p := range problems {
			errs = append(errs, &KeyError{Key: p.Key, Msg: p.Rule})
		}
	}
	// Which keys a kind takes is the rule file's business: the step
	// ignores a tumbling window's slide, a rule file may not write one.
	if len(errs) == 0 && ws.Kind == "tumbling" && a.Written("slide") {
		errs = append(errs, &KeyError{Key: "slide", AtName: true,
			Msg: "`slide` only applies to sliding windows; remove it or use `kind: sliding`"})
	}
	if len(errs) == 0 {
		for _, k := range []string{"size", "slide", "gap", "max_duration"} {
			mine := k == "gap" || k == "max_duration"
			if a.Written(k) && mine != session {
				msg := fmt.Sprintf("`%s` only applies to session windows; remove it or use `kind: session`", k)
				if session {
					msg = fmt.Sprintf("`%s` does not apply to session windows, which end after `gap` without records; remove it", k)
				}
				errs = append(errs, &KeyError{Key: k, AtName: true, Msg: msg})
			}
		}
	}
	fields := slices.Clone(windowRowFields)
	for _, g := range ws.Aggregates {
		if slices.Contains(windowRowFields, g.Name) {
			errs = append(errs, &KeyError{Key: "aggregate", Entry: g.Name, AtName: true,
				Msg: fmt.Sprintf("aggregate name `%s` is a field every window row has; choose another name", g.Name)})
			continue
		}
		fields = append(fields, g.Name)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	plan := &Plan{
		New: func(BuildEnv) (Step, error) { return NewWindow(ws), nil },
		Traits: Traits{Keyed: true, Timed: true, Stateful: true, Absorbing: true, Closes: true,
			Value: ValueReplaced},
		Fields:      fields,
		ClearsNames: true,
		FanOut:      1,
		EndsFanOut:  !ws.EmitOnUpdate,
		FanOutExact: true,
		FanOutUnit:  "window updates",
	}
	if ws.Kind == "sliding" {
		plan.FanOut = WindowsPerRecord(ws.Size, ws.Slide)
		if n := WindowsPerRecord(ws.Size, ws.Slide); n > warnWindowsPerRecord {
			plan.Warnings = append(plan.Warnings, &KeyError{Key: "slide",
				Msg: fmt.Sprintf("every record updates %d windows (size / slide), and the open windows per key are as many: a larger slide costs less", n)})
		}
	}
	if session && ws.MaxDuration == 0 {
		plan.Warnings = append(plan.Warnings, &KeyError{Key: "gap",
			Msg: "a session window without `max_duration` never closes while its key keeps sending records less than `gap` apart: its row waits, and its state stays; give it a `max_duration` (e.g. `max_duration: 4h`)"})
	}
	if ws.Size >= warnDistinctWindow || (session && (ws.MaxDuration == 0 || ws.MaxDuration >= warnDistinctWindow)) {
		for _, g := range ws.Aggregates {
			if g.Func == AggCountDistinct {
				plan.Warnings = append(plan.Warnings, &KeyError{Key: "aggregate", Entry: g.Name,
					Msg: fmt.Sprintf("count_distinct is exact: it keeps every distinct value of an open window, for %s here; a value with many distinct values grows the state with them", windowSpan(ws))})
			}
		}
	}
	return plan, nil
}

// windowSpan says how long a window of ws may last, for messages.
func windowSpan(ws WindowSpec) string {
	switch {
	case ws.Kind != "session":
		return ws.Size.String()
	case ws.MaxDuration > 0:
		return "up to " + ws.MaxDuration.String()
	}
	return "as long as its session lasts"
}

// The analyzer warns above these: a sliding window updating more windows
// per record, and count_distinct over a window at least this long.
const (
	warnWindowsPerRecord = 1000
	warnDistinctWindow   = time.Hour
)

// Aggregate is one `name: func(arg)` entry of window.aggregate. Arg is nil
// for count().
type Aggregate struct {
	Name string
	Func AggFunc
	Arg  *Expr
}

// WindowSpec is a compiled `window:` step.
type WindowSpec struct {
	Kind        string // "tumbling", "sliding" or "session"
	Size, Slide time.Duration
	// Gap and MaxDuration are a session window's (0: no max_duration).
	Gap, MaxDuration time.Duration
	Key              *Expr // nil: one window for all records (key "")
	Aggregates       []Aggregate
	EmitOnUpdate     bool
}

// window is the tumbling and sliding window step.
//
// Assignment: tumbling windows are [k·size, (k+1)·size), sliding windows
// every [k·slide, k·slide+size) that contains the event time; all aligned
// to the epoch. A record updates each of its windows that is still open
// (end > watermark). When none is open the record is late and becomes a
// dead letter with ReasonLate; a record with some windows open only
// updates those.
//
// Closing: Advance(wm) closes every window with end <= wm, in order of end
// then key. With emit on_close the closed window's row is emitted then.
// With on_update a row is emitted after every change and nothing more at
// close (the last update already carried the final row), so a consumer
// sees each state of the window exactly once.
//
// Aggregates ignore a null argument (a missing field), like SQL: sum and
// avg take numbers, min and max take numbers or strings (strings compare
// bytewise, and mixing both kinds in one window is an error), first and
// last keep the value of the record with the smallest / largest event time
// (ties: the earlier / later record processed), count_distinct counts
// distinct values exactly (1 and 1.0 are one value, "1" is another).
// An argument of the wrong type sends the record to the dead-letter output
// with ReasonError before any of its windows change.
//
// State is held in memory, bounded by the open windows, and goes into a
// checkpoint through Snapshot / Restore (layout at the top of this file).
// Windows that close after a checkpoint would open again on a restore;
// the pipeline's close journal (ClosesAt before each Advance, Resume after
// Restore) keeps them closed across a crash.
type window struct {
	spec        WindowSpec
	aggs        []aggregator // of spec.Aggregates, in order
	size, slide int64        // millis; tumbling: slide == size

	byEnd     map[int64]map[string]*winState
	ends      []int64 // the keys of byEnd, ascending
	watermark int64
	hasWM     bool

	invalid error // from ValidateWindow: every record is dead-lettered with it

	// applied is, after Resume, the highest source offset per partition
	// that this instance applied before a crash: a record at or below it
	// whose windows are all closed was already counted (or dead-lettered)
	// and is skipped silently on replay.
	applied map[int32]int64

	args []any // scratch: aggregate arguments of the current record
	wins []int64

	// open counts the window states (window × key) in byEnd, for the
	// open-windows budget (Limits.OpenWindows).
	open int64
}

type winState struct {
	accs []acc
}

// WindowKinds are the kinds of window, as a rule file writes them.
var WindowKinds = []string{"tumbling", "sliding", "session"}

// MaxWindowsPerRecord bounds how many sliding windows one record may fall
// in (size / slide in whole milliseconds, rounded up): each is updated per
// record, so a window of 1h sliding by 1ms would cost 3.6M updates per
// record.
const MaxWindowsPerRecord = 10000

// WindowsPerRecord is the most windows of the given size and slide that
// one record falls in, as the step counts them: sliding windows start at
// multiples of slide in whole milliseconds, so a record is in
// ceil(size / slide) of them (or one fewer). Both must be at least 1ms.
func WindowsPerRecord(size, slide time.Duration) int64 {
	sz, sl := size.Milliseconds(), slide.Milliseconds()
	return (sz + sl - 1) / sl
}

// WindowError is one reason ValidateWindow refuses a window.
type WindowError struct {
	// Key is the rule-file key of the window step the problem is about:
	// "kind", "size" or "slide". The analyzer reports it at that key's
	// value, or at the step when the key is not written.
	Key string
	// Rule says it in the terms of a rule file, as `rtproxy check` shows it.
	Rule string
	// msg says it in the terms of a WindowSpec: a step built from the
	// spec dead-letters every record with it.
	msg string
}

func (e *WindowError) Error() string { return e.msg }

// WindowErrors is every problem ValidateWindow found, in a fixed order.
type WindowErrors []*WindowError

func (l WindowErrors) Error() string {
	parts := make([]string, len(l))
	for i, e := range l {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

// Unwrap exposes the single problems to errors.As.
func (l WindowErrors) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// ValidateWindow is the one check of a window's kind, size and slide:
// the analyzer runs it on every window of a rule file (attaching each
// problem to the file position of its key), and a step built by NewWindow
// runs it too, dead-lettering every record when it fails. So a rule that
// passes `rtproxy check` cannot fail it at run time.
//
// It returns nil or WindowErrors. The size must be at least 1ms, the kind
// tumbling or sliding, and a slide given (non-zero) at least 1ms; only
// when those hold is a sliding window checked further: it needs a slide,
// at most the size, and at most MaxWindowsPerRecord windows per record
// (WindowsPerRecord). A tumbling window ignores its slide.
func ValidateWindow(kind string, size, slide time.Duration) error {
	var errs WindowErrors
	if size < time.Millisecond {
		errs = append(errs, &WindowError{Key: "size",
			Rule: "`window.size` must be at least 1ms: windows are aligned to epoch milliseconds",
			msg:  fmt.Sprintf("window size %v must be at least 1ms", size)})
	}
	if !slices.Contains(WindowKinds, kind) || kind == "session" {
		errs = append(errs, &WindowError{Key: "kind",
			Rule: "`window.kind` must be one of " + strings.Join(WindowKinds, ", "),
			msg:  fmt.Sprintf("window kind %q must be tumbling or sliding", kind)})
	}
	if slide != 0 && slide < time.Millisecond {
		msg := fmt.Sprintf("window slide %v must be at least 1ms", slide)
		if kind == "sliding" {
			msg = fmt.Sprintf("sliding window slide %v must be between 1ms and the size %v", slide, size)
		}
		errs = append(errs, &WindowError{Key: "slide",
			Rule: "`window.slide` must be at least 1ms: windows are aligned to epoch milliseconds",
			msg:  msg})
	}
	if len(errs) > 0 {
		return errs
	}
	if kind == "tumbling" {
		return nil
	}
	switch {
	case slide == 0 || slide > size:
		rule := "a sliding window needs `slide`: how far apart windows start, e.g. `slide: 1m` (at most `size`)"
		if slide != 0 {
			rule = fmt.Sprintf("`slide` (%s) is larger than `size` (%s), so some records would fall in no window; make slide at most size", slide, size)
		}
		return WindowErrors{{Key: "slide", Rule: rule,
			msg: fmt.Sprintf("sliding window slide %v must be between 1ms and the size %v", slide, size)}}
	case WindowsPerRecord(size, slide) > MaxWindowsPerRecord:
		n := WindowsPerRecord(size, slide)
		return WindowErrors{{Key: "slide",
			Rule: fmt.Sprintf("a `size` of %s sliding by %s puts every record in %d windows, more than %d; use a larger slide",
				size, slide, n, MaxWindowsPerRecord),
			msg: fmt.Sprintf("sliding window of size %v and slide %v puts each record in %d windows, more than %d: use a larger slide",
				size, slide, n, MaxWindowsPerRecord)}}
	}
	return nil
}

// Validate is ValidateSession of a session window's gap and max_duration,
// else ValidateWindow of the spec's kind, size and slide.
func (s WindowSpec) Validate() error {
	if s.Kind == "session" {
		return ValidateSession(s.Gap, s.MaxDuration)
	}
	return ValidateWindow(s.Kind, s.Size, s.Slide)
}

// NewWindow returns the `window:` step. It runs ValidateWindow, the
// analyzer's own check of the spec; a step built from an invalid spec
// never hangs or panics, it dead-letters every record with the reason.
//
// A session window (Kind "session") is a step of its own (session.go).
func NewWindow(spec WindowSpec) Keyed {
	if spec.Kind == "session" {
		return newSessionWindow(spec)
	}
	w := &window{
		spec:  spec,
		size:  spec.Size.Milliseconds(),
		slide: spec.Slide.Milliseconds(),
		byEnd: make(map[int64]map[string]*winState),
	}
	if w.size <= 0 {
		w.size = 1
	}
	if spec.Kind != "sliding" || w.slide <= 0 || w.slide > w.size {
		w.slide = w.size
	}
	for _, a := range spec.Aggregates {
		w.aggs = append(w.aggs, aggregatorOf(a.Func))
	}
	w.invalid = spec.Validate()
	return w
}

func (w *window) Kind() string { return "window" }

// Absorbs implements Absorbing: a record is taken into the window's state.
func (w *window) Absorbs() {}

var (
	_ StateSizer = (*window)(nil)
	_ Closer     = (*window)(nil)
)

// ShuffleKey implements Keyed.
func (w *window) ShuffleKey(r *Record) (string, error) {
	return shuffleKey(w.spec.Key, r)
}

// StateKeys implements StateSizer: the number of open (key, window) pairs.
func (w *window) StateKeys() int { return w.OpenWindows() }

// OpenWindows is the number of open (key, window) pairs: the size of the
// step's state.
func (w *window) OpenWindows() int {
	n := 0
	for _, m := range w.byEnd {
		n += len(m)
	}
	return n
}

// floorDiv is floor(a / b) for b > 0, also for negative a.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func (w *window) Process(r *Record, out Emitter) {
	defer recoverTo("window", r, out)
	if w.invalid != nil {
		out.DeadLetter(r, ReasonError, fmt.Errorf("window: %w", w.invalid))
		return
	}
	key, err := shuffleKey(w.spec.Key, r)
	if err != nil {
		out.DeadLetter(r, evalReason(err), fmt.Errorf("window: key: %w", err))
		return
	}
	t := r.EventTime

	// The open windows of t, by ascending end.
	w.wins = w.wins[:0]
	last := floorDiv(t, w.slide) * w.slide
	for s := last; s > t-w.size; s -= w.slide {
		if !w.hasWM || s+w.size > w.watermark {
			w.wins = append(w.wins, s+w.size)
		}
	}
	if len(w.wins) == 0 {
		if a, ok := w.applied[r.Partition]; ok && r.Partition >= 0 && r.Offset >= 0 && r.Offset <= a {
			return // replayed after a crash: its windows were emitted with it
		}
		out.DeadLetter(r, ReasonLate, fmt.Errorf("window: event time %d is late: its last window [%d, %d) closed at watermark %d",
			t, last, last+w.size, w.watermark))
		return
	}
	slices.Reverse(w.wins)

	// Evaluate and check every argument before any window changes, so a
	// dead letter leaves the state as if the record had never come.
	var ok bool
	if w.args, ok = evalArgs(w.spec.Aggregates, w.aggs, w.args[:0], r, out); !ok {
		return
	}
	for _, end := range w.wins {
		if ws := w.byEnd[end][key]; ws != nil {
			for i, a := range w.spec.Aggregates {
				if w.args[i] == nil {
					continue
				}
				if err := w.aggs[i].fits(a, &ws.accs[i], w.args[i]); err != nil {
					out.DeadLetter(r, ReasonError, fmt.Errorf("window: %s: %w", a.Name, err))
					return
				}
			}
		}
	}

	// The record's windows count against the fan-out budget of the input
	// record it came from, and the states it would open against the
	// open-windows budget, before any window changes.
	if !r.fanPaid {
		if err := chargeFanOut(r, "window", int64(len(w.wins))); err != nil {
			if err != errFanOutSpent {
				out.DeadLetter(r, ReasonBudget, fmt.Errorf("window: %w", err))
			}
			return
		}
	}
	if lim := limits.Load().OpenWindows; w.open+int64(len(w.wins)) > lim {
		fresh := int64(0)
		for _, end := range w.wins {
			if w.byEnd[end][key] == nil {
				fresh++
			}
		}
		if w.open+fresh > lim {
			out.DeadLetter(r, ReasonBudget, fmt.Errorf("window: %w", tripped(BudgetOpenWindows,
				"open-windows budget exceeded: the record would open %d more window states (window × key) where %d of at most %d are open (limits.max_open_windows)",
				fresh, w.open, lim)))
			return
		}
	}
	for _, end := range w.wins {
		ws := w.get(end, key)
		for i, agg := range w.aggs {
			// A null argument (a missing field) is not added, as in SQL;
			// count() has none and counts every record.
			if w.args[i] != nil || agg.arity() == 0 {
				agg.add(&ws.accs[i], w.args[i], t)
			}
		}
		if w.spec.EmitOnUpdate {
			out.Emit(w.row(end, key, ws))
		}
	}
}

// get returns the state of window (end, key), creating it.
func (w *window) get(end int64, key string) *winState {
	m := w.byEnd[end]
	if m == nil {
		m = make(map[string]*winState)
		w.byEnd[end] = m
		i, _ := slices.BinarySearch(w.ends, end)
		w.ends = slices.Insert(w.ends, i, end)
	}
	ws := m[key]
	if ws == nil {
		ws = &winState{accs: make([]acc, len(w.spec.Aggregates))}
		m[key] = ws
		w.open++
	}
	return ws
}

// WindowHeader is the header every window row carries: "<start>-<end>".
const WindowHeader = "rtproxy-window"

// row builds the output record of window (end, key).
func (w *window) row(end int64, key string, ws *winState) *Record {
	start := end - w.size
	v := make(map[string]any, 3+len(w.spec.Aggregates))
	v["key"] = key
	v["window_start"] = start
	v["window_end"] = end
	for i, a := range w.spec.Aggregates {
		v[a.Name] = w.aggs[i].value(&ws.accs[i])
	}
	hv := strconv.AppendInt(nil, start, 10)
	hv = append(hv, '-')
	hv = strconv.AppendInt(hv, end, 10)
	return &Record{
		Key:       []byte(key),
		Value:     v,
		Timestamp: end - 1,
		EventTime: end - 1,
		Offset:    -1,
		Partition: -1,
		Headers:   []Header{{Key: WindowHeader, Value: hv}},
		Window:    &WindowRef{Start: start, End: end},
	}
}

// Advance closes every window with end <= watermark. The watermark never
// moves back: a smaller value is ignored.
func (w *window) Advance(watermark int64, out Emitter) {
	if w.hasWM && watermark <= w.watermark {
		return
	}
	w.watermark, w.hasWM = watermark, true
	n := 0
	for _, end := range w.ends {
		if end > watermark {
			break
		}
		n++
		m := w.byEnd[end]
		if !w.spec.EmitOnUpdate {
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				out.Emit(w.row(end, k, m[k]))
			}
		}
		w.open -= int64(len(m))
		delete(w.byEnd, end)
	}
	w.ends = slices.Delete(w.ends, 0, n)
}

// ClosesAt implements Closer: whether Advance(watermark) would close a window. The
// pipeline asks before each Advance, to write its close journal (the
// watermark and the source positions applied so far) only when windows
// really close.
func (w *window) ClosesAt(watermark int64) bool {
	if w.hasWM && watermark <= w.watermark {
		return false
	}
	return len(w.ends) > 0 && w.ends[0] <= watermark
}

// Resume implements Closer. It applies a close journal after Restore: the watermark becomes
// max(restored, watermark), so windows closed before a crash stay closed;
// restored windows with end <= watermark are dropped without a row (they
// were emitted before the crash); and applied (the highest source offset
// per partition this instance had applied when that watermark closed
// windows) decides what a record whose windows are all closed is: at or
// below applied it was already counted and is skipped, above it is late.
func (w *window) Resume(watermark int64, applied map[int32]int64) {
	w.applied = make(map[int32]int64, len(applied))
	for p, o := range applied {
		w.applied[p] = o
	}
	if w.hasWM && watermark <= w.watermark {
		return
	}
	w.watermark, w.hasWM = watermark, true
	n := 0
	for _, end := range w.ends {
		if end > watermark {
			break
		}
		n++
		w.open -= int64(len(w.byEnd[end]))
		delete(w.byEnd, end)
	}
	w.ends = slices.Delete(w.ends, 0, n)
}

// Snapshot implements Stateful; the layout is at the top of this file.
func (w *window) Snapshot(sw Writer) error {
	meta := windowMeta(w.hasWM, w.watermark, w.spec.Aggregates)
	if err := sw.Put([]byte{'m'}, meta); err != nil {
		return fmt.Errorf("window snapshot: %w", err)
	}
	var kb, vb []byte
	for _, end := range w.ends {
		m := w.byEnd[end]
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			kb = append(putTime(append(kb[:0], 'w'), end), k...)
			vb = vb[:0]
			for i, a := range w.spec.Aggregates {
				var err error
				if vb, err = w.aggs[i].encode(vb, &m[k].accs[i]); err != nil {
					return fmt.Errorf("window snapshot: %s: %w", a.Name, err)
				}
			}
			if err := sw.Put(kb, vb); err != nil {
				return fmt.Errorf("window snapshot: %w", err)
			}
		}
	}
	return nil
}

// errSnapshot is wrapped by every Restore error about the bytes.
var errSnapshot = errors.New("window snapshot is corrupt")

// Restore implements Stateful: it replaces the state with the snapshot.
// On error the state is left empty.
func (w *window) Restore(sr Reader) error {
	w.byEnd = make(map[int64]map[string]*winState)
	w.open = 0
	w.ends = w.ends[:0]
	w.watermark, w.hasWM = 0, false
	w.applied = nil
	sawMeta := false
	err := sr.Each(func(k, v []byte) error {
		switch {
		case len(k) == 1 && k[0] == 'm':
			if err := w.restoreMeta(v); err != nil {
				return err
			}
			sawMeta = true
			return nil
		case len(k) >= 9 && k[0] == 'w':
			if !sawMeta {
				return fmt.Errorf("%w: window entry before meta entry", errSnapshot)
			}
			end := getTime(k[1:9])
			ws := w.get(end, string(k[9:]))
			d := snapDec{b: v}
			for i, agg := range w.aggs {
				agg.decode(&d, &ws.accs[i])
			}
			if d.err != nil {
				return fmt.Errorf("%w: window %d key %q: %v", errSnapshot, end, k[9:], d.err)
			}
			if len(d.b) != 0 {
				return fmt.Errorf("%w: window %d key %q: %d trailing bytes", errSnapshot, end, k[9:], len(d.b))
			}
			return nil
		}
		return fmt.Errorf("%w: unknown entry %q", errSnapshot, k)
	})
	if err != nil {
		w.byEnd = make(map[int64]map[string]*winState)
		w.open = 0
		w.ends = w.ends[:0]
		w.watermark, w.hasWM = 0, false
		return fmt.Errorf("window restore: %w", err)
	}
	return nil
}

func (w *window) restoreMeta(v []byte) error {
	has, wm, err := readWindowMeta(v, w.spec.Aggregates)
	if err != nil {
		return err
	}
	w.watermark, w.hasWM = wm, has
	return nil
}

// snapDec reads a snapshot value and remembers its first error, so callers
// check once at the end.
type snapDec struct {
	b   []byte
	err error
}

func (d *snapDec) fail(f string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(f, args...)
	}
	d.b = nil
}

func (d *snapDec) byte() byte {
	if len(d.b) < 1 {
		d.fail("truncated")
		return 0
	}
	x := d.b[0]
	d.b = d.b[1:]
	return x
}

func (d *snapDec) time() int64 {
	if len(d.b) < 8 {
		d.fail("truncated")
		return 0
	}
	t := getTime(d.b)
	d.b = d.b[8:]
	return t
}

func (d *snapDec) float() float64 {
	if len(d.b) < 8 {
		d.fail("truncated")
		return 0
	}
	f := math.Float64frombits(binary.BigEndian.Uint64(d.b))
	d.b = d.b[8:]
	return f
}

func (d *snapDec) uvarint() uint64 {
	x, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return x
}

func (d *snapDec) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("truncated: %d bytes announced, %d left", n, len(d.b))
		return nil
	}
	x := bytes.Clone(d.b[:n])
	d.b = d.b[n:]
	return x
}

// evalArgs evaluates and checks every aggregate's argument of r, appended
// to args, for a window to apply once all are known (a tumbling, sliding or
// session window changes no state for a record that fails). false: r went
// to the dead letters (an argument failed, or is of a kind its aggregate
// refuses).
func evalArgs(aggregates []Aggregate, aggs []aggregator, args []any, r *Record, out Emitter) ([]any, bool) {
	for i, a := range aggregates {
		var v any
		if a.Arg != nil {
			var err error
			if v, err = a.Arg.Eval(r); err != nil {
				out.DeadLetter(r, evalReason(err), fmt.Errorf("window: %s: %w", a.Name, err))
				return args, false
			}
			if v != nil {
				if v, err = aggs[i].check(a, v); err != nil {
					out.DeadLetter(r, ReasonError, fmt.Errorf("window: %s: %w", a.Name, err))
					return args, false
				}
			}
		}
		args = append(args, v)
	}
	return args, true
}
