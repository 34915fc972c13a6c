package ruletest

import (
	"errors"
	"time"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/rules"
)

// detailHeader carries, in a view test's report only, the full text of an
// error whose placeholder (rules.ViewError) withholds it from the client.
const detailHeader = "rtproxy-view-error-detail"

// runView runs one test of a view file: each input record is a stored
// record of the view's topic, fetched by the test's client; what the
// client gets is compared with expect.records. A record the view filters
// out is absent (its offset is a gap); one it cannot process is the
// placeholder the proxy serves: a null value and only the
// rtproxy-view-error header, saying why. A client the view does not apply
// to fetches the records as stored.
func runView(t *Test, def *rules.Route, fail func(int, string, ...any)) {
	v := def.View
	if t.Expect.Sink != nil || t.Expect.DeadLetters != nil {
		fail(t.Expect.Line, "a view writes no sink and no dead letters: expect `records:`, what a client of view %q fetches", def.Name)
		return
	}
	if len(t.Tables) > 0 {
		fail(t.Line, "a view has no tables")
		return
	}
	applies := true
	if c := t.Client; c != nil {
		applies = v.AppliesTo(rules.ViewClientMatch{ClientID: c.ClientID, Principal: c.Principal, TLSSubject: c.TLSSubject})
	}
	next := map[int32]int64{}
	var got []pipeline.DriverOutput
	var at [][2]int64 // partition, offset of each record got
	for _, s := range t.Steps {
		if s.Input == nil {
			fail(s.Line, "a view runs record by record and has no clock: `advance` has nothing to move")
			return
		}
		in, err := driverInput(s.Input)
		if err != nil {
			fail(s.Line, "input record: %v", err)
			return
		}
		if s.Input.Timestamp == nil {
			in.Timestamp = time.UnixMilli(0).UTC() // a record without one: epoch 0
		}
		off := s.Input.Offset
		if off < 0 {
			off = next[in.Partition]
		}
		next[in.Partition] = off + 1
		out := pipeline.DriverOutput{Topic: def.Name, Key: in.Key, Value: in.Value, Headers: in.Headers, Timestamp: in.Timestamp}
		if applies {
			rec := &rules.ViewRecord{Topic: v.Topic, Partition: in.Partition, Offset: off, Key: in.Key, Raw: in.Value,
				Headers: in.Headers, Timestamp: in.Timestamp.UnixMilli()}
			value, keep, err := v.Run(rec, nil)
			switch {
			case err != nil:
				out.Value, out.Headers = nil, []operators.Header{{Key: rules.ViewErrorHeader, Value: []byte(err.Error())}}
				var ve *rules.ViewError
				if errors.As(err, &ve) && ve.Detail != "" {
					// For the rule's author only: the client is never told.
					out.Headers = append(out.Headers, operators.Header{Key: detailHeader, Value: []byte(ve.Detail)})
				}
			case !keep:
				continue
			default:
				out.Value = value
			}
		}
		got = append(got, out)
		at = append(at, [2]int64{int64(in.Partition), off})
	}
	want := t.Expect.Records
	if want == nil {
		want = []*Record{} // records: not given, so none are expected
	}
	compareWith(fail, t.Expect, "records", want, got, true, rules.ViewErrorHeader)
	if t.Expect.AnyOrder {
		return
	}
	for i, w := range want[:min(len(want), len(got))] {
		if w.Partition != 0 && int64(w.Partition) != at[i][0] {
			fail(w.Line, "records record %d is from partition %d, want partition %d", i+1, at[i][0], w.Partition)
		}
		if w.Offset >= 0 && w.Offset != at[i][1] {
			fail(w.Line, "records record %d is at offset %d, want offset %d (a record the view filters out leaves a gap)", i+1, at[i][1], w.Offset)
		}
	}
}
