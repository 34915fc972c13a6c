package jsoncodec

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	v, err := Decode([]byte(`{"b":1,"a":[true,null,"x",2.5],"c":{"z":1e3,"y":-0.5}}`))
	if err != nil {
		t.Fatal(err)
	}
	m := v.(map[string]any)
	if n, ok := m["b"].(float64); !ok || n != 1 {
		t.Fatalf("numbers must decode as float64, got %T %v", m["b"], m["b"])
	}
	out, err := Append([]byte("prefix:"), v)
	if err != nil {
		t.Fatal(err)
	}
	// Keys sorted, numbers in shortest form, appended after dst.
	if want := `prefix:{"a":[true,null,"x",2.5],"b":1,"c":{"y":-0.5,"z":1000}}`; string(out) != want {
		t.Fatalf("got %s\nwant %s", out, want)
	}
	for _, bad := range []string{``, `{`, `{"a":1} x`, `{"a":}`, `nul`} {
		if _, err := Decode([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "decode json: ") {
			t.Errorf("Decode(%q) = %v, want a decode json error", bad, err)
		}
	}
	if _, err := Append(nil, math.Inf(1)); err == nil || !strings.HasPrefix(err.Error(), "encode json: ") {
		t.Errorf("Append(+Inf) = %v, want an encode json error", err)
	}
}

// Types Append does not write itself go to encoding/json, alone or inside
// a value it does write, so the whole output is still what Marshal writes.
func TestAppendFallbackIsEncodingJSON(t *testing.T) {
	type row struct {
		A string  `json:"a"`
		B float64 `json:"b,omitempty"`
	}
	others := []any{
		time.Date(2026, 11, 29, 9, 0, 0, 123e6, time.UTC),
		[]string{"<a>", "é"},
		map[string]string{"z": "1", "a": "&"},
		map[int]any{2: "b", 1: []any{1.5}},
		json.Number("1.50"),
		row{A: "\u2028"},
		&row{B: 2},
		[]byte("raw"),
		uint8(7),
		[]int{},
		struct{}{},
	}
	for _, v := range others {
		for _, in := range []any{v, map[string]any{"k": v, "n": []any{v, nil}}} {
			got, err := Append(nil, in)
			if err != nil {
				t.Fatalf("%#v: %v", in, err)
			}
			want, err := json.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%#v:\n got  %s\n want %s", in, got, want)
			}
		}
	}
	if _, err := Append(nil, map[string]any{"c": make(chan int)}); err == nil || !strings.HasPrefix(err.Error(), "encode json: ") {
		t.Fatalf("a channel: %v, want an encode json error", err)
	}
}
