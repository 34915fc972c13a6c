package operators

import (
	"fmt"
	"math"
	mathrand "math/rand"
	"reflect"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// fastExprs are expressions of the shapes rule files use, each with
// whether the fast path takes it.
var fastExprs = []struct {
	src  string
	fast bool
}{
	{`value`, true},
	{`value.amount`, true},
	{`value["amount"]`, true},
	{`value.card.country`, true},
	{`value.amount > 0`, true},
	{`value.amount >= 0 && value.status != "test"`, true},
	{`value.amount > 0 and value.status != "test" or value.vip == true`, true},
	{`value.amount / (value.risk.score + 1.0)`, true},
	{`value.amount * 100`, true},
	{`-value.amount + 3`, true},
	{`value.a - value.b * 2 / value.c`, true},
	{`value.name + "!"`, true},
	{`value.name + value.other`, true},
	{`value.name < "m"`, true},
	{`value.amount == nil`, true},
	{`nil != value.missing`, true},
	{`!(value.amount > 10)`, true},
	{`not value.flag`, true},
	{`value.flag ? value.a : value.b`, true},
	{`value.amount > 10 ? "big" : "small"`, true},
	{`merchant.avg * 2`, true},
	{`merchant.name == value.name`, true},
	{`merchant`, true},
	{`value.amount == -1`, true},
	{`value.amount != -1.5`, true},
	{`value.flag == false`, true},
	{`value.a < value.b`, true},
	{`value.a == value.b`, true},
	{`value.b >= value.a && value.c != 4`, true},
	{`value.amount > 0.5`, true},
	{`value.amount >= 9007199254740993`, true},
	// Left to the VM.
	{`1 + 2`, false},
	{`value?.amount`, false},
	{`value.amount % 2`, false},
	{`value.amount ** 2`, false},
	{`len(value.name)`, false},
	{`value.items[0]`, false},
	{`value.name matches "^a"`, false},
	{`"a" in value.tags`, false},
	{`value.amount ?? 0`, false},
	{`key == "k1"`, false},
	{`let x = value.a; x + 1`, false},
	{`value.name startsWith "a"`, false},
}

// fastValues are the records the expressions meet: every type a member can
// hold, and the mixes where the fast path must give up.
var fastValues = []string{
	`{"amount":7.07,"status":"ok","card":{"country":"DE"},"risk":{"score":0.5},"name":"alice","other":"bob","a":1,"b":2,"c":4,"flag":true,"vip":false}`,
	`{"amount":0,"status":"test","risk":{"score":-1},"name":"","a":-1e300,"b":1e300,"c":0,"flag":false}`,
	`{"amount":-1,"status":null,"card":null,"risk":{},"name":5,"other":"x","flag":"yes","vip":true}`,
	`{"amount":"12","card":"DE","risk":{"score":"x"},"name":"z","other":null,"a":"s","b":"t","c":"u","flag":null}`,
	`{"amount":-1.5,"card":[1,2],"risk":[],"name":"m","other":["x"],"a":1,"b":0,"c":0,"flag":1}`,
	`{"amount":1e308,"risk":{"score":1e308},"a":true,"b":false,"c":{}}`,
	`{}`,
	`[]`,
	`"just a string"`,
	`12.5`,
	`null`,
}

// intValues are values as Avro and Protobuf decode them: integers, where
// expr compares two integers exactly and an integer with a float64 as
// float64s (2^53+1 tells the two apart).
var intValues = []map[string]any{
	{"amount": int64(7), "a": int64(1 << 53), "b": int64(1<<53 + 1), "c": int32(-4), "name": "n", "flag": true},
	{"amount": int64(0), "a": int32(2), "b": 2.0, "c": int64(-1), "other": int64(3)},
	{"amount": int64(-1), "a": int64(9007199254740993), "b": 9007199254740992.0, "c": 4.0},
}

// fastTestValues are fastValues decoded, then intValues.
func fastTestValues(t *testing.T) []any {
	var vs []any
	for _, js := range fastValues {
		v, err := jsoncodec.Decode([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
	}
	for _, m := range intValues {
		vs = append(vs, m)
	}
	return vs
}

// fastBound are join rows bound as `merchant`.
var fastBound = []map[string]any{
	nil,
	{"merchant": map[string]any{"avg": 2.5, "name": "alice"}},
	{"merchant": map[string]any{"avg": "x"}},
	{"merchant": nil},
	{"merchant": "not a row"},
}

// sameResult compares a fast result with the VM's (NaN equals NaN).
func sameResult(a, b any) bool {
	if x, ok := a.(float64); ok {
		if y, ok := b.(float64); ok && math.IsNaN(x) && math.IsNaN(y) {
			return true
		}
	}
	return reflect.DeepEqual(a, b) && reflect.TypeOf(a) == reflect.TypeOf(b)
}

// checkFastAgrees evaluates e on r both ways: whenever the fast path gives
// a value, the VM gives the same value and no error. It reports whether
// the fast path gave one.
func checkFastAgrees(t testing.TB, e *Expr, r *Record) bool {
	t.Helper()
	if e.fast == nil {
		return false
	}
	got, ok := e.fast.eval(r)
	if !ok {
		return false
	}
	want, err := e.evalVM(r)
	if err != nil {
		t.Fatalf("%s on %v (bound %v): fast path gave %#v, the VM failed: %v", e.Source, r.Value, r.Bound, got, err)
	}
	if !sameResult(got, want) {
		t.Fatalf("%s on %v (bound %v): fast path gave %#v (%T), the VM %#v (%T)", e.Source, r.Value, r.Bound, got, got, want, want)
	}
	return true
}

// TestFastExprAgreesWithVM: every expression of the table, on every value
// and join row, gives through Eval exactly what the VM gives (value or
// error), and the fast path takes the shapes it should and gives a value
// on the records whose types it knows.
func TestFastExprAgreesWithVM(t *testing.T) {
	for _, tc := range fastExprs {
		e, err := CompileExpr(tc.src, []string{"merchant"})
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		if (e.fast != nil) != tc.fast {
			t.Errorf("%s: fast path %v, want %v", tc.src, e.fast != nil, tc.fast)
			continue
		}
		fastHits := 0
		for _, v := range fastTestValues(t) {
			js := fmt.Sprint(v)
			for _, bound := range fastBound {
				r := &Record{Value: v, Bound: bound}
				if checkFastAgrees(t, e, r) {
					fastHits++
				}
				got, gotErr := e.Eval(r)
				want, wantErr := e.evalVM(r)
				if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || (wantErr == nil && !sameResult(got, want)) {
					t.Fatalf("%s on %s: Eval gave %#v, %v; the VM %#v, %v", tc.src, js, got, gotErr, want, wantErr)
				}
			}
		}
		if tc.fast && fastHits == 0 {
			t.Errorf("%s: the fast path never gave a value", tc.src)
		}
	}
}

// TestFastExprTakesTheBenchmarkRecords: on the benchmarks' payments the
// fast path evaluates the chain's expressions itself.
func TestFastExprTakesTheBenchmarkRecords(t *testing.T) {
	v, err := jsoncodec.Decode([]byte(`{"amount":7.07,"status":"ok","user_id":"user-1","merchant_id":"m-1","risk":{"score":0.25}}`))
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{Value: v}
	for _, src := range []string{`value.amount > 0 && value.status != "test"`, `value.amount / (value.risk.score + 1.0)`, `value.user_id`} {
		e, err := CompileExpr(src, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !checkFastAgrees(t, e, r) {
			t.Errorf("%s: not evaluated by the fast path", src)
		}
	}
}

// TestFastExprErrorsStayTheVMs: where the VM fails, Eval fails with its
// positioned message, the fast path having given up.
func TestFastExprErrorsStayTheVMs(t *testing.T) {
	for _, tc := range []struct{ src, value, want string }{
		{`value.card.country`, `{"card":null}`, "cannot fetch country from <nil>"},
		{`value.amount > 0`, `{"amount":"x"}`, "invalid operation"},
		{`value.a && value.b`, `{"a":1,"b":true}`, ""},
		{`value.name + value.other`, `{"name":"a","other":1}`, "invalid operation"},
	} {
		e, err := CompileExpr(tc.src, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, err := jsoncodec.Decode([]byte(tc.value))
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Eval(&Record{Value: v})
		if err == nil || !strings.HasPrefix(err.Error(), tc.src+": ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s on %s: error %v, want one starting with the source and saying %q", tc.src, tc.value, err, tc.want)
		}
	}
}

// FuzzFastExpr: for any expression and JSON value, a value the fast path
// gives is the VM's value.
func FuzzFastExpr(f *testing.F) {
	for _, tc := range fastExprs {
		f.Add(tc.src, []byte(fastValues[0]))
	}
	for _, v := range fastValues {
		f.Add(`value.a + value.b > value.c || value.name == "x"`, []byte(v))
	}
	f.Fuzz(func(t *testing.T, src string, js []byte) {
		if len(src) > 200 {
			return
		}
		e, err := CompileExpr(src, []string{"merchant"})
		if err != nil || e.fast == nil {
			return
		}
		v, err := jsoncodec.Decode(js)
		if err != nil {
			return
		}
		m, _ := v.(map[string]any)
		checkFastAgrees(t, e, &Record{Value: v, Bound: map[string]any{"merchant": m}})
	})
}

// TestFastExprRandomTrees: expressions grown at random from every node
// kind the fast path takes (paths into value and a join row, each kind of
// literal, comparisons, arithmetic, logic, negation, conditionals) agree
// with the VM on values of every JSON type, wherever the fast path gives
// a value; and the fast path gives one often enough to matter.
func TestFastExprRandomTrees(t *testing.T) {
	rng := mathrand.New(mathrand.NewSource(13))
	leaves := []string{`9007199254740992`, `value.n`, `value.m`, `value.s`, `value.t`, `value.b`, `value.z`, `value.o.n`, `value.o.s`,
		`value["n"]`, `merchant.n`, `merchant.s`, `0`, `1`, `-2`, `2.5`, `-0.5`, `1e300`, `"a"`, `"b"`, `""`,
		`true`, `false`, `nil`}
	binary := []string{"==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "&&", "||", "and", "or"}
	var grow func(depth int) string
	grow = func(depth int) string {
		if depth == 0 || rng.Intn(3) == 0 {
			return leaves[rng.Intn(len(leaves))]
		}
		switch rng.Intn(6) {
		case 0:
			return "-(" + grow(depth-1) + ")"
		case 1:
			return "!(" + grow(depth-1) + ")"
		case 2:
			return "(" + grow(depth-1) + " ? " + grow(depth-1) + " : " + grow(depth-1) + ")"
		}
		return "(" + grow(depth-1) + " " + binary[rng.Intn(len(binary))] + " " + grow(depth-1) + ")"
	}
	values := []string{
		`{"n":3,"m":-1.5,"s":"x","t":"y","b":true,"z":null,"o":{"n":0,"s":"a"}}`,
		`{"n":0,"m":0,"s":"","t":"","b":false,"o":{"n":1e300,"s":""}}`,
		`{"n":"3","m":true,"s":1,"t":null,"b":"true","z":[1],"o":"not an object"}`,
		`{"n":1e308,"m":1e308,"s":"b","t":"a","b":false,"z":{},"o":null}`,
		`{}`,
		`[1,2]`,
	}
	rows := []map[string]any{
		{"merchant": map[string]any{"n": 2.0, "s": "a"}},
		{"merchant": map[string]any{"n": "2"}},
		nil,
	}
	var decoded []any
	for _, js := range values {
		v, err := jsoncodec.Decode([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		decoded = append(decoded, v)
	}
	decoded = append(decoded, map[string]any{"n": int64(3), "m": int32(-1), "s": "x", "b": true,
		"o": map[string]any{"n": int64(1<<53 + 1), "s": "a"}})
	compiled, took := 0, 0
	for i := 0; i < 4000; i++ {
		src := grow(4)
		e, err := CompileExpr(src, []string{"merchant"})
		if err != nil || e.fast == nil {
			continue
		}
		compiled++
		for _, v := range decoded {
			for _, row := range rows {
				if checkFastAgrees(t, e, &Record{Value: v, Bound: row}) {
					took++
				}
			}
		}
	}
	if compiled < 500 || took < 1000 {
		t.Fatalf("only %d random expressions had a fast path, and it gave %d values: the generator no longer exercises it", compiled, took)
	}
	t.Logf("%d expressions with a fast path; it gave %d values, each the VM's", compiled, took)
}

// BenchmarkExprEval is a filter's expression on a JSON number (float64),
// an Avro long (int64), both on the fast path, and a Protobuf float
// (float32), which the fast path gives up on: Eval (fast path first)
// against the VM alone. The last pair is what a give-up costs.
func BenchmarkExprEval(b *testing.B) {
	e, err := CompileExpr(`value.amount > 0 && value.status != "test"`, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		amount any
	}{{"float64", 7.07}, {"int64", int64(7)}, {"float32", float32(7.07)}} {
		r := &Record{Value: map[string]any{"amount": tc.amount, "status": "ok"}}
		for _, via := range []string{"eval", "vm"} {
			b.Run(tc.name+"/"+via, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					var v any
					var err error
					if via == "eval" {
						v, err = e.Eval(r)
					} else {
						v, err = e.evalVM(r)
					}
					if err != nil || v != true {
						b.Fatalf("%v, %v", v, err)
					}
				}
			})
		}
	}
}
