package serde

import (
	"encoding/binary"
	"runtime"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

func zigzagLong(n int64) []byte { return binary.AppendVarint(nil, n) }

// TestAvroLengthsBoundedByTheRecord (issue 25 finding 5): a fixed, bytes
// or string longer than what is left of the record is refused before
// anything is allocated for it. The sizes here cost 100 MB and 1 MB
// before the bound; the 1e11 fixed of the finding runs only once the
// smaller one is bounded.
func TestAvroLengthsBoundedByTheRecord(t *testing.T) {
	check := func(name, schema string, body []byte) bool {
		t.Helper()
		s := fuzzSchema(t, sr.TypeAvro, schema)
		var err error
		n := allocated(func() { _, err = (&Decoder{format: Avro}).decode(s, body) })
		if err == nil || !strings.Contains(err.Error(), "left") {
			t.Errorf("%s: error %v, want one saying what is left of the record", name, err)
		}
		if n > 64<<10 {
			t.Errorf("%s: decoding %d bytes allocated %d bytes", name, len(body), n)
			return false
		}
		return true
	}
	if check("fixed 1e8", `{"type":"fixed","name":"F","size":100000000}`, []byte("xyz")) {
		check("fixed 1e11", `{"type":"fixed","name":"F","size":100000000000}`, []byte("xyz"))
	}
	check("string", `"string"`, append(zigzagLong(1_000_000), "abc"...))
	check("bytes", `"bytes"`, append(zigzagLong(1_000_000), "abc"...))
	check("string in a record", `{"type":"record","name":"R","fields":[{"name":"a","type":"string"},{"name":"b","type":"string"}]}`,
		append(append(zigzagLong(3), "abc"...), append(zigzagLong(900_000), "x"...)...))
	check("map key", `{"type":"map","values":"null"}`, append(zigzagLong(1), zigzagLong(1_000_000)...))
	check("decimal fixed", `{"type":"fixed","name":"D","size":50000000,"logicalType":"decimal","precision":4,"scale":2}`, []byte("ab"))
}

// TestAvroStringsBeyondOneMiB: a string longer than hamba's default cap
// (1 MiB) decodes when the record holds it.
func TestAvroStringsBeyondOneMiB(t *testing.T) {
	s := fuzzSchema(t, sr.TypeAvro, `"string"`)
	long := strings.Repeat("x", 2<<20)
	v, err := (&Decoder{format: Avro}).decode(s, append(zigzagLong(int64(len(long))), long...))
	if err != nil || v != long {
		t.Fatalf("2 MiB string: %v", err)
	}
}

// TestProtobufLengthsBoundedByTheRecord: a length-delimited field that
// claims more than the record holds is refused without allocating it
// (protowire checks every length against what is left).
func TestProtobufLengthsBoundedByTheRecord(t *testing.T) {
	s := fuzzSchema(t, sr.TypeProtobuf, "syntax = \"proto3\";\nmessage M { bytes b = 1; string s = 2; repeated int64 p = 3; map<string, string> m = 4; M sub = 5; }\n")
	if _, err := (&Decoder{format: Protobuf}).decode(s, []byte{0}); err != nil { // the descriptor's cache, built once
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"bytes":  append([]byte{0, 0x0a}, binary.AppendUvarint(nil, 1e11)...),
		"string": append([]byte{0, 0x12}, binary.AppendUvarint(nil, 1e9)...),
		"packed": append([]byte{0, 0x1a}, binary.AppendUvarint(nil, 1e9)...),
		"map":    append([]byte{0, 0x22}, binary.AppendUvarint(nil, 1e9)...),
		"sub":    append([]byte{0, 0x2a}, binary.AppendUvarint(nil, 1e9)...),
	} {
		var err error
		n := allocated(func() { _, err = (&Decoder{format: Protobuf}).decode(s, append(body, "xyz"...)) })
		if err == nil || n > 64<<10 {
			t.Errorf("%s: error %v, %d bytes allocated", name, err, n)
		}
	}
}
