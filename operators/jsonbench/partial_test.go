package jsonbench

// The partial-decode workload: a route reads two members of a record
// (value.amount, value.card.country), so only those are built; the rest of
// the record is checked, not built, and a record that is not valid JSON
// anywhere is refused. And the write side: set one member, add one, and
// produce the output bytes.

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/bytedance/sonic"
	"github.com/bytedance/sonic/ast"
	"github.com/minio/simdjson-go"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/fastjson"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// getter validates a whole record and returns its amount and its card
// object as Go values (card as encoding/json would decode it into any).
type getter struct {
	name string
	// skip, when set, says why this candidate cannot run here.
	skip func() string
	// new makes one getter; a benchmark or test makes its own so that a
	// candidate may keep a parser or tape to reuse, as a sink would keep
	// one per goroutine.
	new func() func([]byte) (amount float64, card map[string]any, err error)
}

var errNoMember = errors.New("member missing or of the wrong type")

var partialWant = jsoncodec.Fields{"amount": {}, "card": {}}

var getters = []getter{
	{name: "rtproxy", new: func() func([]byte) (float64, map[string]any, error) {
		return func(b []byte) (float64, map[string]any, error) {
			v, _, err := jsoncodec.DecodeMembers(b, partialWant)
			if err != nil {
				return 0, nil, err
			}
			m, _ := v.(map[string]any)
			amount, ok1 := m["amount"].(float64)
			card, ok2 := m["card"].(map[string]any)
			if !ok1 || !ok2 {
				return 0, nil, errNoMember
			}
			return amount, card, nil
		}
	}},
	// gjson: ValidBytes checks the whole record, then each GetBytes scans
	// from the start to its member; Value builds the card map.
	{name: "gjson", new: func() func([]byte) (float64, map[string]any, error) {
		return func(b []byte) (float64, map[string]any, error) {
			if !gjson.ValidBytes(b) {
				return 0, nil, errors.New("gjson: invalid json")
			}
			a := gjson.GetBytes(b, "amount")
			c := gjson.GetBytes(b, "card")
			if a.Type != gjson.Number || !c.IsObject() {
				return 0, nil, errNoMember
			}
			card, _ := c.Value().(map[string]any)
			return a.Num, card, nil
		}
	}},
	// fastjson: ParseBytes parses the whole record into its own reused tree
	// (strings and numbers kept raw, read lazily); card is then converted.
	{name: "fastjson", new: func() func([]byte) (float64, map[string]any, error) {
		var p fastjson.Parser
		return func(b []byte) (float64, map[string]any, error) {
			return fastjsonGet(&p, b)
		}
	}},
	// fastjson ParseBytes does not check what is inside strings or all of
	// a number's grammar (see TestPartialRejects); ValidateBytes does.
	{name: "fastjson+Validate", new: func() func([]byte) (float64, map[string]any, error) {
		var p fastjson.Parser
		return func(b []byte) (float64, map[string]any, error) {
			if err := fastjson.ValidateBytes(b); err != nil {
				return 0, nil, err
			}
			return fastjsonGet(&p, b)
		}
	}},
	// sonic: Valid checks the whole record (the Searcher's own validation
	// stops at the member found, so `[1,}` after it passes); two searches with validation off, and
	// Interface builds the card map.
	{name: "sonic/ast", new: func() func([]byte) (float64, map[string]any, error) {
		return func(b []byte) (float64, map[string]any, error) {
			if !sonic.Valid(b) {
				return 0, nil, errors.New("sonic: invalid json")
			}
			s := ast.NewSearcher(string(b))
			s.ValidateJSON = false
			a, err := s.GetByPath("amount")
			if err != nil {
				return 0, nil, err
			}
			amount, err := a.Float64()
			if err != nil {
				return 0, nil, err
			}
			c, err := s.GetByPath("card")
			if err != nil {
				return 0, nil, err
			}
			cv, err := c.Interface()
			if err != nil {
				return 0, nil, err
			}
			card, ok := cv.(map[string]any)
			if !ok {
				return 0, nil, errNoMember
			}
			return amount, card, nil
		}
	}},
	// simdjson: Parse builds a tape of the whole record (reused), then two
	// lookups; Interface builds the card map.
	{name: "simdjson", skip: func() string {
		if !simdjson.SupportedCPU() {
			return "simdjson-go needs AVX2 and CLMUL, which this CPU lacks"
		}
		return ""
	}, new: func() func([]byte) (float64, map[string]any, error) {
		var pj *simdjson.ParsedJson
		var el simdjson.Element
		return func(b []byte) (float64, map[string]any, error) {
			var err error
			if pj, err = simdjson.Parse(b, pj, simdjson.WithCopyStrings(false)); err != nil {
				return 0, nil, err
			}
			it := pj.Iter()
			if _, err := it.FindElement(&el, "amount"); err != nil {
				return 0, nil, err
			}
			amount, err := el.Iter.Float()
			if err != nil {
				return 0, nil, err
			}
			if _, err := it.FindElement(&el, "card"); err != nil {
				return 0, nil, err
			}
			cv, err := el.Iter.Interface()
			if err != nil {
				return 0, nil, err
			}
			card, ok := cv.(map[string]any)
			if !ok {
				return 0, nil, errNoMember
			}
			return amount, card, nil
		}
	}},
}

func fastjsonGet(p *fastjson.Parser, b []byte) (float64, map[string]any, error) {
	v, err := p.ParseBytes(b)
	if err != nil {
		return 0, nil, err
	}
	amount, err := v.Get("amount").Float64()
	if err != nil {
		return 0, nil, err
	}
	c := v.Get("card")
	if c == nil || c.Type() != fastjson.TypeObject {
		return 0, nil, errNoMember
	}
	cv, err := fastjsonAny(c)
	if err != nil {
		return 0, nil, err
	}
	return amount, cv.(map[string]any), nil
}

// fastjsonAny converts a fastjson value to what encoding/json decodes into
// any: fastjson has no such conversion of its own.
func fastjsonAny(v *fastjson.Value) (any, error) {
	switch v.Type() {
	case fastjson.TypeObject:
		o, _ := v.Object()
		m := make(map[string]any, o.Len())
		var err error
		o.Visit(func(k []byte, e *fastjson.Value) {
			if err != nil {
				return
			}
			var x any
			if x, err = fastjsonAny(e); err == nil {
				m[string(k)] = x
			}
		})
		return m, err
	case fastjson.TypeArray:
		a, _ := v.Array()
		s := make([]any, len(a))
		for i, e := range a {
			x, err := fastjsonAny(e)
			if err != nil {
				return nil, err
			}
			s[i] = x
		}
		return s, nil
	case fastjson.TypeString:
		sb, _ := v.StringBytes()
		return string(sb), nil
	case fastjson.TypeNumber:
		return v.Float64()
	case fastjson.TypeTrue:
		return true, nil
	case fastjson.TypeFalse:
		return false, nil
	default:
		return nil, nil
	}
}

func BenchmarkPartialGet(b *testing.B) {
	in := payment(7)
	for _, g := range getters {
		b.Run(g.name, func(b *testing.B) {
			if g.skip != nil {
				if why := g.skip(); why != "" {
					b.Skip(why)
				}
			}
			get := g.new()
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			cpu0 := cpuNow()
			for b.Loop() {
				amount, card, err := get(in)
				if err != nil || amount == 0 || card["country"] != "DE" {
					b.Fatal(amount, card, err)
				}
			}
			reportCPU(b, cpu0)
		})
	}
}

// BenchmarkPartialValidate times the scanners alone: the whole record
// checked, nothing built (DecodeMembers with no member wanted builds an
// empty map).
func BenchmarkPartialValidate(b *testing.B) {
	in := payment(7)
	none := jsoncodec.Fields{}
	valid := []struct {
		name string
		ok   func([]byte) bool
	}{
		{"rtproxy", func(b []byte) bool { _, _, err := jsoncodec.DecodeMembers(b, none); return err == nil }},
		{"encoding/json", json.Valid},
		{"gjson", gjson.ValidBytes},
		{"fastjson", func(b []byte) bool { return fastjson.ValidateBytes(b) == nil }},
		{"sonic", sonic.Valid},
	}
	for _, v := range valid {
		b.Run(v.name, func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			cpu0 := cpuNow()
			for b.Loop() {
				if !v.ok(in) {
					b.Fatal("refused")
				}
			}
			reportCPU(b, cpu0)
		})
	}
}

// The splice step: amount set to a new value and risk_level added (the
// payment already has a "risk" member, so adding "risk" would replace it).
const newAmount = 14.14

type splicer struct {
	name string
	new  func(in []byte) func(dst []byte) ([]byte, error)
}

var splicers = []splicer{
	// The object DecodeMembers made and steps changed; only the splice is
	// timed, as for sjson, which also trusts its input.
	{"rtproxy", func(in []byte) func([]byte) ([]byte, error) {
		v, _, err := jsoncodec.DecodeMembers(in, jsoncodec.Fields{"amount": {}})
		if err != nil {
			panic(err)
		}
		m := v.(map[string]any)
		m["amount"] = newAmount
		m["risk_level"] = "high"
		return func(dst []byte) ([]byte, error) { return jsoncodec.SpliceMembers(dst, in, m) }
	}},
	// The whole step: DecodeMembers (validating), set, splice; compare with
	// fastjson, which cannot set without parsing.
	{"rtproxy-decode+splice", func(in []byte) func([]byte) ([]byte, error) {
		want := jsoncodec.Fields{"amount": {}}
		return func(dst []byte) ([]byte, error) {
			v, _, err := jsoncodec.DecodeMembers(in, want)
			if err != nil {
				return nil, err
			}
			m := v.(map[string]any)
			m["amount"] = newAmount
			m["risk_level"] = "high"
			return jsoncodec.SpliceMembers(dst, in, m)
		}
	}},
	// sjson: two SetBytes, each copying the record; no validation.
	{"sjson", func(in []byte) func([]byte) ([]byte, error) {
		return func([]byte) ([]byte, error) {
			out, err := sjson.SetBytes(in, "amount", newAmount)
			if err != nil {
				return nil, err
			}
			return sjson.SetBytes(out, "risk_level", "high")
		}
	}},
	// fastjson: parse (reused parser), Set twice, MarshalTo the reused
	// buffer.
	{"fastjson-parse+set", func(in []byte) func([]byte) ([]byte, error) {
		var p fastjson.Parser
		var a fastjson.Arena
		return func(dst []byte) ([]byte, error) {
			v, err := p.ParseBytes(in)
			if err != nil {
				return nil, err
			}
			a.Reset()
			v.Set("amount", a.NewNumberFloat64(newAmount))
			v.Set("risk_level", a.NewString("high"))
			return v.MarshalTo(dst), nil
		}
	}},
}

func BenchmarkPartialSplice(b *testing.B) {
	in := payment(7)
	for _, s := range splicers {
		b.Run(s.name, func(b *testing.B) {
			splice := s.new(in)
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			cpu0 := cpuNow()
			for b.Loop() {
				out, err := splice(buf[:0])
				if err != nil || len(out) < len(in) {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu0)
		})
	}
}

func TestPartialSameResult(t *testing.T) {
	in := payment(7)
	var full map[string]any
	if err := json.Unmarshal(in, &full); err != nil {
		t.Fatal(err)
	}
	for _, g := range getters {
		t.Run(g.name, func(t *testing.T) {
			if g.skip != nil {
				if why := g.skip(); why != "" {
					t.Skip(why)
				}
			}
			get := g.new()
			amount, card, err := get(in)
			if err != nil {
				t.Fatal(err)
			}
			if amount != full["amount"] || !reflect.DeepEqual(card, full["card"]) {
				t.Errorf("got amount %v card %v, want %v %v", amount, card, full["amount"], full["card"])
			}
		})
	}
}

// invalidRecords are not JSON, each for a different reason, all after the
// members read; encoding/json and jsoncodec.Decode refuse them all.
var invalidRecords = []struct{ name, rec string }{
	{"array-trailing-comma", `{"amount":1,"card":{},"x":[1,}`},
	{"payment-trailing-comma", string(payment(7)[:1022]) + `",}`},
	{"control-char-in-string", "{\"amount\":1,\"card\":{},\"x\":\"a\x01b\"}"},
	{"bad-escape", `{"amount":1,"card":{},"x":"\q"}`},
	{"leading-zero", `{"amount":1,"card":{},"x":01}`},
	{"no-fraction-digit", `{"amount":1,"card":{},"x":1.}`},
	{"bad-literal", `{"amount":1,"card":{},"x":tru}`},
	{"trailing-garbage", `{"amount":1,"card":{}} x`},
	{"missing-close", `{"amount":1,"card":{},"x":1`},
	{"number-out-of-range", `{"amount":1,"card":{},"x":1e400}`},
}

// validRecords are records encoding/json and jsoncodec.Decode accept,
// though they are odd after the members read.
var validRecords = []struct{ name, rec string }{
	{"invalid-utf8-in-string", "{\"amount\":1,\"card\":{},\"x\":\"a\xffb\"}"},
	{"escaped-surrogate-pair", `{"amount":1,"card":{},"x":"\ud83d\ude00"}`},
	{"lone-surrogate-escape", `{"amount":1,"card":{},"x":"\ud800"}`},
	{"deep-array", `{"amount":1,"card":{},"x":` + strings.Repeat("[", 900) + strings.Repeat("]", 900) + `}`},
}

// strict lists the valid records a candidate is known to refuse: fastjson
// stops at a depth of 300 (encoding/json at 10000), simdjson refuses an
// escaped lone surrogate that encoding/json turns into U+FFFD.
var strict = map[string][]string{
	"fastjson":          {"deep-array"},
	"fastjson+Validate": {"deep-array"},
	"simdjson":          {"lone-surrogate-escape"},
}

// lenient lists the invalid records a candidate is known to accept: it is
// then no drop-in replacement for jsoncodec's validating scanner. The
// syntax validators accept 1e400, which encoding/json refuses to decode
// into a float64 (so does jsoncodec).
var lenient = map[string][]string{
	"gjson":             {"number-out-of-range"},
	"fastjson":          {"control-char-in-string", "bad-escape", "leading-zero", "no-fraction-digit", "number-out-of-range"},
	"fastjson+Validate": {"number-out-of-range"},
	// sonic.Valid (v1.15.5) skips strings without checking escapes or
	// control characters: bytedance/sonic issue 938, fix proposed in PR 974.
	"sonic/ast": {"control-char-in-string", "bad-escape", "number-out-of-range"},
}

func TestPartialRejects(t *testing.T) {
	for _, r := range invalidRecords {
		var v any
		if json.Unmarshal([]byte(r.rec), &v) == nil {
			t.Fatalf("%s: encoding/json accepts %q", r.name, r.rec)
		}
		if _, err := jsoncodec.Decode([]byte(r.rec)); err == nil {
			t.Fatalf("%s: jsoncodec.Decode accepts %q", r.name, r.rec)
		}
	}
	for _, r := range validRecords {
		var v any
		if err := json.Unmarshal([]byte(r.rec), &v); err != nil {
			t.Fatalf("%s: encoding/json refuses %q: %v", r.name, r.rec, err)
		}
		if _, err := jsoncodec.Decode([]byte(r.rec)); err != nil {
			t.Fatalf("%s: jsoncodec.Decode refuses %q: %v", r.name, r.rec, err)
		}
	}
	for _, g := range getters {
		t.Run(g.name, func(t *testing.T) {
			if g.skip != nil {
				if why := g.skip(); why != "" {
					t.Skip(why)
				}
			}
			get := g.new()
			var accepted []string
			for _, r := range invalidRecords {
				if _, _, err := get([]byte(r.rec)); err == nil {
					accepted = append(accepted, r.name)
				}
			}
			if fmt.Sprint(accepted) != fmt.Sprint(lenient[g.name]) {
				t.Errorf("accepts %v, want %v", accepted, lenient[g.name])
			}
			var refused []string
			for _, r := range validRecords {
				if a, _, err := get([]byte(r.rec)); err != nil || a != 1 {
					refused = append(refused, r.name)
				}
			}
			if fmt.Sprint(refused) != fmt.Sprint(strict[g.name]) {
				t.Errorf("refuses valid %v, want %v", refused, strict[g.name])
			}
			// Valid again after refusing: a reused parser recovers.
			if a, _, err := get([]byte(`{"amount":1,"card":{"country":"DE"},"x":[1]}`)); err != nil || a != 1 {
				t.Errorf("after invalid records: amount %v, %v", a, err)
			}
		})
	}
}

func TestPartialSplice(t *testing.T) {
	in := payment(7)
	orig := string(in)
	var want map[string]any
	if err := json.Unmarshal(in, &want); err != nil {
		t.Fatal(err)
	}
	want["amount"] = newAmount
	want["risk_level"] = "high"
	for _, s := range splicers {
		t.Run(s.name, func(t *testing.T) {
			out, err := s.new(in)(nil)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("output is not JSON: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %s", out)
			}
			if !strings.Contains(string(out), `"amount":14.14`) || string(in) != orig {
				t.Errorf("amount not written in place or input changed: %s", out)
			}
		})
	}
}
