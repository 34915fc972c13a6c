package main

import (
	"encoding/binary"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/protocol"
	"github.com/rtproxy/rtproxy/rules"
)

const fuzzAvsc = `{"type":"record","name":"P","fields":[{"name":"id","type":"string"},{"name":"amount","type":"double"},{"name":"tags","type":{"type":"array","items":"string"}}]}`

// avroGuard is an avro guard on topic t (amount > 0) bound to an
// in-process registry holding fuzzAvsc as id 1.
func avroGuard(t testing.TB) (*guardOf, avro.Schema) {
	t.Helper()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	reg.SeedSchema("t-value", 1, 1, sr.Schema{Schema: fuzzAvsc, Type: sr.TypeAvro})
	dir := t.TempDir()
	p := filepath.Join(dir, "g.yaml")
	if err := os.WriteFile(p, []byte("guard: g\ntopic: t\nformat: avro\nchecks:\n  - check: value.amount > 0\n    name: positive\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := rules.LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGuards(slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), nil, nil, serde.Config{URL: reg.URL()}, func(protocol.Guards) {})
	if err != nil {
		t.Fatal(err)
	}
	o := &guardOf{name: "g", g: f.Guard, gs: g}
	o.dec = g.newGuardDecoder(f, g.sr)
	return o, avro.MustParse(fuzzAvsc)
}

// FuzzGuardAvroValue: whatever bytes are produced, the guard never panics
// and never asks for a retry (the registry answers); a record passes only
// when it is in the wire format with id 1 and hamba/avro, an independent
// decoder, reads the payload whole with amount > 0.
func FuzzGuardAvroValue(f *testing.F) {
	sch := avro.MustParse(fuzzAvsc)
	good, _ := avro.Marshal(sch, map[string]any{"id": "x", "amount": 2.5, "tags": []string{"a", "b"}})
	neg, _ := avro.Marshal(sch, map[string]any{"id": "y", "amount": -1.0, "tags": []string{}})
	frame := func(id uint32, b []byte) []byte {
		h := []byte{0, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(h[1:], id)
		return append(h, b...)
	}
	for _, s := range [][]byte{frame(1, good), frame(1, neg), frame(2, good), frame(1, good[:3]), []byte(`{"amount":1}`), {0}, {}, frame(1, append(good, 0))} {
		f.Add(s)
	}
	o, _ := avroGuard(f)
	// The reference, bounded: hamba allocates a block's count up front.
	ref := avro.Config{MaxSliceAllocSize: 1 << 16, MaxByteSliceSize: 1 << 16}.Freeze()
	f.Fuzz(func(t *testing.T, b []byte) {
		check, msg, ok, retry := o.CheckRetriable("t", 0, &protocol.ProducedRecord{Value: b})
		if retry {
			t.Fatalf("retry (%s: %s) from a registry that answers", check, msg)
		}
		var want bool
		if len(b) >= 5 && b[0] == 0 && binary.BigEndian.Uint32(b[1:5]) == 1 {
			var v struct {
				ID     string   `avro:"id"`
				Amount float64  `avro:"amount"`
				Tags   []string `avro:"tags"`
			}
			// hamba reads a prefix; the guard also refuses trailing bytes.
			r := avro.NewReader(nil, 0, avro.WithReaderConfig(ref)).Reset(b[5:])
			r.ReadVal(sch, &v)
			whole := r.Error == nil
			if whole {
				r.Read(make([]byte, 1)) // fails at the end of the payload
				whole = r.Error != nil
			}
			want = whole && v.Amount > 0
		}
		if ok != want {
			t.Fatalf("value %x: guard ok=%v (%s: %s), reference %v", b, ok, check, msg, want)
		}
		if !ok && check != "g/positive" && check != "g/decode" {
			t.Fatalf("value %x failed %q", b, check)
		}
	})
}

// A reload keeps the registry client (and its schema cache) of a guard
// still in force, and drops the ones no guard uses any more.
func TestGuardRegistriesKeptAcrossReloads(t *testing.T) {
	dir := t.TempDir()
	load := func(name, body string) *rules.Route {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := rules.LoadFileWith(p, rules.Options{Allow: &rules.Allow{URLs: []string{"http://127.0.0.1:1"}}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := load("a.yaml", "guard: a\ntopic: a\nformat: avro\nchecks:\n  - check: value.x > 0\n")
	b := load("b.yaml", "guard: b\ntopic: b\nformat: avro\nschema_registry: { url: \"http://127.0.0.1:1\" }\nchecks:\n  - check: value.x > 0\n")
	var set protocol.Guards
	g, err := newGuards(slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), nil, nil,
		serde.Config{URL: "http://127.0.0.1:2"}, func(s protocol.Guards) { set = s })
	if err != nil {
		t.Fatal(err)
	}
	regsOf := func() map[*serde.Registry]bool {
		g.regs.mu.Lock()
		defer g.regs.mu.Unlock()
		m := map[*serde.Registry]bool{}
		for _, r := range g.regs.all {
			m[r] = true
		}
		return m
	}
	g.apply([]*rules.Route{a, b})
	if set.For("a") == nil || set.For("b") == nil {
		t.Fatal("guards not in force")
	}
	before := regsOf()
	if len(before) != 2 {
		t.Fatalf("%d registry clients, want 2 (the proxy's and b's)", len(before))
	}
	g.apply([]*rules.Route{a})
	after := regsOf()
	if len(after) != 1 {
		t.Errorf("%d registry clients after b went, want 1", len(after))
	}
	for r := range after {
		if !before[r] {
			t.Error("the reload made a new registry client for a guard still in force: its schema cache is lost")
		}
	}
	g.apply(nil)
	if n := len(regsOf()); n != 0 {
		t.Errorf("%d registry clients with no guard, want 0", n)
	}
}
