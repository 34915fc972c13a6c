package operators

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestEnvFollowsValueChanges(t *testing.T) {
	r := &Record{Key: []byte("k"), Value: map[string]any{"a": 1.0}, Headers: []Header{{Key: "h", Value: []byte("v")}}}
	a, _ := CompileExpr("value.a", nil)
	hdr, _ := CompileExpr(`headers.h + key`, nil)
	m, _ := CompileExpr("merchant?.x ?? -1", []string{"merchant"})
	if v, _ := a.Eval(r); v != 1.0 {
		t.Fatalf("value.a = %v", v)
	}
	r.Value = map[string]any{"a": 2.0}
	if v, _ := a.Eval(r); v != 2.0 {
		t.Fatalf("after replacing Value, value.a = %v, want 2", v)
	}
	if v, _ := hdr.Eval(r); v != "vk" {
		t.Fatalf("headers.h + key = %v", v)
	}
	if v, err := m.Eval(r); err != nil || v != -1 {
		t.Fatalf("unbound merchant: %v %v", v, err)
	}
	r.Bound = map[string]any{"merchant": map[string]any{"x": 7.0}}
	if v, _ := m.Eval(r); v != 7.0 {
		t.Fatalf("bound merchant: %v", v)
	}
	r.Key = []byte("other")
	r.ResetEnv()
	if v, _ := hdr.Eval(r); v != "vother" {
		t.Fatalf("after ResetEnv: %v", v)
	}
}

type panicTable struct{}

func (panicTable) Lookup(string) (map[string]any, bool) { panic("table exploded") }

type oneDead struct {
	emitted int
	reason  Reason
	err     error
}

func (o *oneDead) Emit(*Record) { o.emitted++ }
func (o *oneDead) DeadLetter(_ *Record, reason Reason, err error) {
	o.reason, o.err = reason, err
}

func TestPanicBecomesDeadLetter(t *testing.T) {
	on, _ := CompileExpr("value.m", nil)
	var o oneDead
	NewJoin(panicTable{}, on, "m", MissingKeep).Process(&Record{Value: map[string]any{"m": "x"}}, &o)
	if o.emitted != 0 || o.reason != ReasonError || o.err == nil || !strings.Contains(o.err.Error(), "join: internal panic: table exploded") {
		t.Fatalf("got emitted=%d reason=%q err=%v", o.emitted, o.reason, o.err)
	}
}

func TestFileTableReload(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "t.jsonl")
	write := func(s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"id":"a","v":1}` + "\n")
	ft, err := LoadFileTable(p, "id")
	if err != nil {
		t.Fatal(err)
	}
	write(`{"id":"a","v":2}` + "\n" + `{"id":"b","v":3}` + "\n")
	if err := ft.Reload(); err != nil {
		t.Fatal(err)
	}
	if row, ok := ft.Lookup("a"); !ok || row["v"] != 2.0 || ft.Len() != 2 {
		t.Fatalf("after reload: %v %v len=%d", row, ok, ft.Len())
	}
	write(`{"id":"a","v":9}` + "\n" + `not json` + "\n")
	err = ft.Reload()
	if err == nil || !strings.Contains(err.Error(), "t.jsonl:2: decode json") {
		t.Fatalf("broken reload: %v", err)
	}
	if row, _ := ft.Lookup("a"); row["v"] != 2.0 || ft.Len() != 2 {
		t.Fatalf("a failed reload must keep the old rows, got %v len=%d", row, ft.Len())
	}
}

func TestMapTableConcurrent(t *testing.T) {
	mt := NewMapTable()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				k := string(rune('a' + (i+w)%26))
				mt.Set(k, map[string]any{"i": i})
				mt.Lookup(k)
				if i%3 == 0 {
					mt.Delete(k)
				}
			}
		}()
	}
	wg.Wait()
	mt.Set("x", map[string]any{"v": 1})
	mt.Delete("y")
	if row, ok := mt.Lookup("x"); !ok || row["v"] != 1 {
		t.Fatalf("lookup x: %v %v", row, ok)
	}
	mt.Delete("x")
	if _, ok := mt.Lookup("x"); ok {
		t.Fatal("x still there after Delete")
	}
}

func TestWindowRestoreRefusesOtherAggregates(t *testing.T) {
	a := NewWindow(windowSpec(t, "tumbling", 1000, 1000, false))
	a.Process(&Record{EventTime: 5, Value: map[string]any{"user": "u", "v": 1.0, "s": "x"}}, &oneDead{})
	var sw snapWriter
	if err := a.(Stateful).Snapshot(&sw); err != nil {
		t.Fatal(err)
	}
	spec := windowSpec(t, "tumbling", 1000, 1000, false)
	spec.Aggregates = spec.Aggregates[:3]
	b := NewWindow(spec)
	err := b.(Stateful).Restore(&sw)
	if err == nil || !strings.Contains(err.Error(), "window snapshot has 8 aggregates, the step has 3") {
		t.Fatalf("got %v", err)
	}
	sw.vals[1] = sw.vals[1][:len(sw.vals[1])-1]
	err = NewWindow(windowSpec(t, "tumbling", 1000, 1000, false)).(Stateful).Restore(&sw)
	if !errors.Is(err, errSnapshot) {
		t.Fatalf("truncated entry: %v", err)
	}
}

func TestIsAggregate(t *testing.T) {
	for _, n := range []string{"count", "sum", "min", "max", "avg", "first", "last", "count_distinct"} {
		if !IsAggregate(n) {
			t.Errorf("IsAggregate(%q) = false", n)
		}
	}
	for _, n := range []string{"", "mean", "COUNT", "len"} {
		if IsAggregate(n) {
			t.Errorf("IsAggregate(%q) = true", n)
		}
	}
}

// TestExprSemantics pins what the fetch and bound patches must keep:
// expr's own results and error texts for member access.
func TestExprSemantics(t *testing.T) {
	r := &Record{
		Key:     []byte("k"),
		Value:   map[string]any{"a": map[string]any{"b": 2.0}, "list": []any{1.0, "x"}, "n": nil},
		Headers: []Header{{Key: "h", Value: []byte("v")}},
		Bound:   map[string]any{"m": map[string]any{"avg": 4.0}, "miss": nil},
	}
	for _, tc := range []struct{ src, want string }{
		{`value.a.b * 2`, "4"},
		{`value["a"]["b"]`, "2"},
		{`value.list[1]`, "x"},
		{`value.nope`, "<nil>"},
		{`value.n?.x ?? "d"`, "d"},
		{`value?.a?.b`, "2"},
		{`m.avg + value.a.b`, "6"},
		{`miss?.avg ?? -1`, "-1"},
		{`headers.h + headers["nope"]`, "v"},
		{`value.n.x`, `value.n.x: cannot fetch x from <nil> (1:9)`},
		{`miss.avg`, `miss.avg: cannot fetch avg from <nil> (1:6)`},
		{`value.list.x`, `value.list.x: invalid operation: int(string) (1:12)`},
		{`len(value.a) + 1`, "2"},
	} {
		e, err := CompileExpr(tc.src, []string{"m", "miss"})
		if err != nil {
			t.Errorf("%s: compile: %v", tc.src, err)
			continue
		}
		v, err := e.Eval(r)
		got := fmt.Sprint(v)
		if err != nil {
			got = strings.SplitN(err.Error(), "\n", 2)[0]
		}
		if got != tc.want {
			t.Errorf("%s = %q, want %q", tc.src, got, tc.want)
		}
	}
	if _, err := CompileExpr("valeu.a", nil); err == nil || !strings.Contains(err.Error(), "unknown name valeu") {
		t.Errorf("unknown name: %v", err)
	}
}

// TestExprSharedAcrossWorkers: one compiled Expr is shared by the step
// instances of every worker; evaluating it concurrently must give each
// record its own answer (run with -race to check the VM pool).
func TestExprSharedAcrossWorkers(t *testing.T) {
	e, err := CompileExpr(`value.n * 2 + (m?.k ?? 0)`, []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				n := float64(w*10000 + i)
				r := &Record{Value: map[string]any{"n": n}}
				if i%2 == 0 {
					r.Bound = map[string]any{"m": map[string]any{"k": 1.0}}
				}
				v, err := e.Eval(r)
				want := 2 * n
				if i%2 == 0 {
					want++
				}
				if err != nil || v != want {
					errs <- fmt.Sprintf("worker %d record %d: %v %v, want %v", w, i, v, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestWindowSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		kind        string
		size, slide time.Duration
		want        string
	}{
		{"tumbling", time.Minute, 0, ""},
		{"sliding", time.Minute, time.Second, ""},
		{"sliding", 10 * time.Second, time.Millisecond, ""},
		{"tumbling", 0, 0, "window size 0s must be at least 1ms"},
		{"hopping", time.Minute, 0, `window kind "hopping" must be tumbling or sliding`},
		{"sliding", time.Minute, 2 * time.Minute, "sliding window slide 2m0s must be between 1ms and the size 1m0s"},
		{"sliding", time.Hour, time.Millisecond, "sliding window of size 1h0m0s and slide 1ms puts each record in 3600000 windows, more than 10000: use a larger slide"},
	} {
		spec := WindowSpec{Kind: tc.kind, Size: tc.size, Slide: tc.slide, Aggregates: []Aggregate{{Name: "n", Func: AggCount}}}
		err := spec.Validate()
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("%s %v/%v: %q, want %q", tc.kind, tc.size, tc.slide, got, tc.want)
		}
		if err != nil {
			var o oneDead
			NewWindow(spec).Process(&Record{EventTime: 5}, &o)
			if o.emitted != 0 || o.reason != ReasonError || o.err == nil || o.err.Error() != "window: "+tc.want {
				t.Errorf("invalid spec step: emitted %d, %q %v", o.emitted, o.reason, o.err)
			}
		}
	}
}

// TestShuffleKeyCacheFollowsChanges: a key computed by ShuffleKey is
// reused by Process, but not after a step changed what it reads.
func TestShuffleKeyCacheFollowsChanges(t *testing.T) {
	key, _ := CompileExpr("value.id", nil)
	d := NewDropDuplicates(key, 0, nil)
	r := &Record{Value: map[string]any{"id": "a"}}
	if k, _ := d.ShuffleKey(r); k != "a" {
		t.Fatalf("key %q", k)
	}
	newID, _ := CompileExpr(`"b"`, nil)
	NewSet([]Field{{Name: "id", Expr: newID}}).Process(r, &oneDead{})
	if k, _ := d.ShuffleKey(r); k != "b" {
		t.Fatalf("after set, key %q, want b", k)
	}
	other, _ := CompileExpr(`"c"`, nil)
	NewMap([]Field{{Name: "id", Expr: other}}).Process(r, &oneDead{})
	if k, _ := d.ShuffleKey(r); k != "c" {
		t.Fatalf("after map, key %q, want c", k)
	}
}
