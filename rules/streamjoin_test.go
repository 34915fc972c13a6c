package rules

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const streamJoinBase = "route: r\nsource: { topic: payments, event_time: value.ts }\nsink: { topic: out }\nsteps:\n"

// TestStreamJoinNeedsGrace: `rtproxy check` refuses a stream join
// without `grace`, at the step, saying why: its state would otherwise
// have no bound.
func TestStreamJoinNeedsGrace(t *testing.T) {
	file := streamJoinBase + "  - join:\n      stream: { topic: authorizations, event_time: value.ts }\n      on: value.auth_id\n      other: value.id\n      within: { before: 5m, after: 1m }\n      as: auth\n"
	got := loadErrors(t, map[string]string{"r.yaml": file})
	want := "r.yaml:5:5: join needs `grace`: how long records may come late, e.g. `grace: 30s`: it bounds the state (each side is kept for `within` + `grace`), so it must be written (near `join`)"
	if strings.Join(got, "\n") != want {
		t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), want)
	}
}

// TestStreamJoinRefusals: what check refuses in a stream join, each at
// its place.
func TestStreamJoinRefusals(t *testing.T) {
	for _, c := range []struct{ step, want string }{
		{"  - join: { stream: { topic: payments }, on: value.a, other: value.b, within: { before: 1m }, grace: 1s, as: x }\n",
			"r.yaml:5:30: `join.stream.topic` is the route's source topic; a stream join reads a second topic (near `payments`)"},
		{"  - join: { stream: { topic: out }, on: value.a, other: value.b, within: { before: 1m }, grace: 1s, as: x }\n",
			"r.yaml:5:30: `join.stream.topic` is where the route writes; reading it would feed the join its own outputs (near `out`)"},
		{"  - join: { stream: { topic: a }, on: value.a, other: value.b, within: {}, grace: 1s, as: x }\n",
			"r.yaml:5:64: `join.within` needs `before` or `after` (or both), e.g. `within: { before: 5m, after: 1m }` (near `within`)"},
		{"  - join: { stream: { topic: a, format: xml }, on: value.a, other: value.b, within: { after: 1m }, grace: 1s, as: x }\n",
			"r.yaml:5:41: `join.stream.format` must be one of json, raw, avro, protobuf (near `xml`)"},
		{"  - join: { stream: { topic: a, format: avro, message_indexes: zigzag }, on: value.a, other: value.b, within: { after: 1m }, grace: 1s, as: x }\n",
			"r.yaml:5:47: `join.stream.message_indexes` is for `join.stream.format: protobuf` (near `message_indexes`)"},
		{"  - join: { stream: { topic: a, format: protobuf, message_indexes: signed }, on: value.a, other: value.b, within: { after: 1m }, grace: 1s, as: x }\n",
			"r.yaml:5:68: `join.stream.message_indexes` must be one of zigzag, unsigned; did you mean `unsigned`? (near `signed`)"},
		{"  - join: { stream: { topic: a }, on: value.a, other: value.b, within: { after: -1m }, grace: 1s, as: x }\n",
			"r.yaml:5:81: `join.within.after` must not be negative (near `-1m`)"},
		{"  - join: { stream: { topic: a, evnt_time: value.t }, on: value.a, other: value.b, within: { after: 1m }, grace: 1s, as: x }\n",
			"r.yaml:5:33: unknown field `evnt_time` in join.stream; did you mean `event_time`? (near `evnt_time`)"},
	} {
		got := loadErrors(t, map[string]string{"r.yaml": streamJoinBase + c.step})
		if strings.Join(got, "\n") != c.want {
			t.Errorf("%s errors:\n got: %s\nwant: %s", c.step, strings.Join(got, "\n      "), c.want)
		}
	}
}

// TestStreamJoinPlan: the step reads the second topic (StepSpec.Input),
// is keyed and timed with two inputs, binds `as`, and what `other` and
// the stream's event_time read is not counted among the source's members.
func TestStreamJoinPlan(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"r.yaml": streamJoinBase +
		"  - join: { stream: { topic: auths, event_time: value.auth_ts }, on: value.auth_id, other: value.id, within: { before: 5m }, grace: 0s, as: auth }\n" +
		"  - set:\n      approved: auth?.ok\n"})
	r, err := LoadFile(filepath.Join(dir, "r.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	st := r.Steps[0]
	if st.Input == nil || st.Input.Topic != "auths" || st.Input.EventTime == nil || st.Input.Format != "json" {
		t.Fatalf("input %+v", st.Input)
	}
	if tr := st.Traits; !tr.Keyed || !tr.Timed || !tr.TwoInputs || !tr.Absorbing || tr.Stateful || tr.Closes {
		t.Fatalf("traits %+v", tr)
	}
	if !r.Source.DecodeMembers || !slices.Equal(r.Source.Members, []string{"auth_id", "ts"}) {
		t.Fatalf("source members %v (whole: %v); the other side's reads leaked in", r.Source.Members, !r.Source.DecodeMembers)
	}
}

// TestStreamJoinStreamMembers: the stream's records are decoded with only
// the members anything reads of them (StreamInput.Members): its `other`
// and `event_time`, and what the later steps (and the sink key) read
// through `as`; whole when something reads the bound value whole, or when
// the stream is raw. A comparison with nil reads no member.
func TestStreamJoinStreamMembers(t *testing.T) {
	join := "  - join: { stream: { topic: auths, event_time: value.auth_ts }, on: value.auth_id, other: value.id, within: { before: 5m }, grace: 0s, kind: left, as: auth }\n"
	for _, c := range []struct {
		name, after string
		want        []string // nil: whole
	}{
		{"members", "  - filter: auth != nil\n  - map:\n      p: value.id\n      ok: auth?.ok\n      card: auth.card.country\n", []string{"auth_ts", "card", "id", "ok"}},
		{"not read", "  - filter: value.amount > 0\n", []string{"auth_ts", "id"}},
		{"sink key", "  - set: { x: \"1\" }\nsink:\n  topic: out\n  key: auth?.merchant\n", []string{"auth_ts", "id", "merchant"}},
		{"window aggregate", "  - window:\n      kind: tumbling\n      size: 1m\n      key: value.card\n      aggregate:\n        n: sum(auth?.amount)\n", []string{"amount", "auth_ts", "id"}},
		{"whole", "  - map: { p: value.id, auth: auth }\n", nil},
		{"whole by index", "  - set:\n      x: auth[value.field]\n", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := streamJoinBase + join + c.after
			if strings.Contains(c.after, "sink:") {
				src = strings.Replace(src, "sink: { topic: out }\n", "", 1)
			}
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"r.yaml": src})
			r, err := LoadFile(filepath.Join(dir, "r.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			if m := r.Steps[0].Input.Members; m != nil {
				got = slices.Sorted(maps.Keys(m))
			}
			if !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
				t.Fatalf("stream members %v, want %v", got, c.want)
			}
		})
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"r.yaml": streamJoinBase +
		"  - join: { stream: { topic: auths, format: raw }, on: value.auth_id, other: value, within: { before: 5m }, grace: 0s, as: auth }\n"})
	r, err := LoadFile(filepath.Join(dir, "r.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if m := r.Steps[0].Input.Members; m != nil {
		t.Fatalf("raw stream: members %v", m)
	}
}

// TestStreamJoinRegistryFormats: the stream may be Avro or Protobuf in
// the Confluent wire format (with message_indexes for Protobuf, zigzag by
// default), as the source may; a route whose only registry format is its
// stream's uses the registry.
func TestStreamJoinRegistryFormats(t *testing.T) {
	for _, c := range []struct{ stream, format, indexes string }{
		{"{ topic: auths, event_time: value.ts, format: avro }", "avro", ""},
		{"{ topic: auths, event_time: value.ts, format: protobuf }", "protobuf", "zigzag"},
		{"{ topic: auths, format: protobuf, message_indexes: unsigned }", "protobuf", "unsigned"},
		{"{ topic: auths }", "json", ""},
	} {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"r.yaml": streamJoinBase +
			"  - join: { stream: " + c.stream + ", on: value.auth_id, other: value.id, within: { before: 5m }, grace: 1s, as: auth }\n"})
		r, err := LoadFile(filepath.Join(dir, "r.yaml"))
		if err != nil {
			t.Fatalf("%s: %v", c.stream, err)
		}
		in := r.Steps[0].Input
		if in == nil || in.Format != c.format || in.MessageIndexes != c.indexes {
			t.Fatalf("%s: input %+v", c.stream, in)
		}
		// The step's definition (its fingerprint) names how the stream is read.
		def := "format=" + c.format
		if c.indexes != "" {
			def += " message_indexes=" + c.indexes
		}
		if !strings.Contains(r.Steps[0].Def, def+"}") {
			t.Fatalf("%s: definition %q does not end the stream with %q", c.stream, r.Steps[0].Def, def)
		}
		if r.Source.Format != FormatJSON || r.UsesRegistry() != Format(c.format).Registry() {
			t.Fatalf("%s: source %s, uses the registry: %v", c.stream, r.Source.Format, r.UsesRegistry())
		}
	}
}
