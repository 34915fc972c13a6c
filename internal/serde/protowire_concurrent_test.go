package serde

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestProtobufFirstDecodesAtOnce: the first records of a schema decoded at
// the same time by several tasks (a route's partitions, two routes on one
// topic) all see every field. The decoder's per-descriptor plan was shared
// before its fields were filled in, so a task arriving meanwhile read a
// message without them: the field was skipped as unknown, and a route
// reading it (event_time: value.ts) dead-lettered the record
// (TestProtobufRouteWithSrSerde failed about one run in fifty on a loaded
// machine, "got 1 of 2 records").
func TestProtobufFirstDecodesAtOnce(t *testing.T) {
	const fields, tasks, rounds = 200, 8, 120
	var src strings.Builder
	src.WriteString("syntax = \"proto3\";\npackage rtproxy.race;\nmessage Inner { string s = 1; int64 n = 2; }\nmessage Wide {\n")
	for i := 1; i <= fields; i++ {
		if i%2 == 0 {
			fmt.Fprintf(&src, "  Inner m%d = %d;\n", i, i)
		} else {
			fmt.Fprintf(&src, "  string f%d = %d;\n", i, i)
		}
	}
	src.WriteString("}\n")
	// The record sets the last string field and the last message field.
	var rec []byte
	rec = protowire.AppendTag(rec, fields-1, protowire.BytesType)
	rec = protowire.AppendString(rec, "last")
	var inner []byte
	inner = protowire.AppendTag(inner, 1, protowire.BytesType)
	inner = protowire.AppendString(inner, "in")
	rec = protowire.AppendTag(rec, fields, protowire.BytesType)
	rec = protowire.AppendBytes(rec, inner)
	lastStr, lastMsg := fmt.Sprintf("f%d", fields-1), fmt.Sprintf("m%d", fields)

	bad := 0
	for round := range rounds {
		// A fresh compile each round: descriptors the decoder has never
		// seen, so every round is a first use.
		c := protocompile.Compiler{Resolver: &protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{"wide.proto": src.String()})}}
		files, err := c.Compile(context.Background(), "wide.proto")
		if err != nil {
			t.Fatal(err)
		}
		md := files[0].Messages().ByName("Wide")
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range tasks {
			wg.Add(1)
			go func(md protoreflect.MessageDescriptor) {
				defer wg.Done()
				<-start
				v, err := protoWireDecode(md, rec)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					bad++
					return
				}
				m := v.(map[string]any)
				in, _ := m[lastMsg].(map[string]any)
				if m[lastStr] != "last" || in == nil || in["s"] != "in" {
					if bad < 3 {
						t.Errorf("round %d: decoded %s=%v %s=%v, want last and {s: in}", round, lastStr, m[lastStr], lastMsg, m[lastMsg])
					}
					bad++
				}
			}(md)
		}
		close(start)
		wg.Wait()
	}
	if bad > 0 {
		t.Errorf("%d of %d concurrent first decodes missed a field", bad, tasks*rounds)
	}
}
