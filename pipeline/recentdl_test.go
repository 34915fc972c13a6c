package pipeline

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// dlRecord is a dead letter as deadLetter builds it.
func dlRecord(i int, value []byte) *kgo.Record {
	return &kgo.Record{Topic: "orders.dlq", Key: fmt.Appendf(nil, "k%d", i), Value: value, Headers: []kgo.RecordHeader{
		{Key: HeaderReason, Value: []byte("decode")},
		{Key: HeaderError, Value: fmt.Appendf(nil, "bad value %d", i)},
		{Key: HeaderRoute, Value: []byte("orders")},
		{Key: HeaderStep, Value: []byte("source")},
		{Key: HeaderSource, Value: fmt.Appendf(nil, "orders/2/%d", 100+i)},
	}}
}

// The ring keeps the last RecentDeadLetterCount per route, newest first,
// with the reason headers as fields, sensitive header values never kept,
// and keys and values only when asked, bounded.
func TestRecentDeadLetters(t *testing.T) {
	sensitive := regexp.MustCompile(`(?i)authorization|token`)
	m := &Manager{cfg: Config{RedactHeader: sensitive.MatchString}}
	r := &route{m: m, name: "orders"}
	ts := time.UnixMilli(1_700_000_000_000)
	for i := range 25 {
		r.noteDeadLetter(dlRecord(i, []byte("not json")), []operators.Header{
			{Key: "Authorization", Value: []byte("Bearer hunter2")},
			{Key: "x-trace", Value: []byte("t-1")},
			{Key: "x-long", Value: []byte(strings.Repeat("é", 300))},
		}, ts, "")
	}
	got := m.RecentDeadLetters("orders")
	if len(got) != RecentDeadLetterCount {
		t.Fatalf("%d kept, want %d", len(got), RecentDeadLetterCount)
	}
	for j, d := range got {
		i := 24 - j // newest first
		if d.Reason != "decode" || d.Step != "source" || d.Error != fmt.Sprintf("bad value %d", i) ||
			d.Topic != "orders" || d.Partition != 2 || d.Offset != int64(100+i) || !d.Timestamp.Equal(ts) || d.At.IsZero() {
			t.Fatalf("entry %d: %+v", j, d)
		}
		if d.ValuesKept || d.Key != nil || d.Value != nil || d.ValueLen != 8 || d.KeyLen != len(fmt.Sprint("k", i)) {
			t.Fatalf("entry %d kept a key or value without RecentValues: %+v", j, d)
		}
		if len(d.Headers) != 3 {
			t.Fatalf("entry %d headers: %+v", j, d.Headers)
		}
		if h := d.Headers[0]; h.Key != "Authorization" || h.Value != Redacted || !h.Redacted {
			t.Errorf("sensitive header kept as %+v", h)
		}
		if h := d.Headers[1]; h.Key != "x-trace" || h.Value != "t-1" || h.Redacted {
			t.Errorf("plain header kept as %+v", h)
		}
		if h := d.Headers[2]; !h.Truncated || len(h.Value) > recentHeaderBytes || !utf8.ValidString(h.Value) {
			t.Errorf("long header kept as %d bytes, truncated %v, valid UTF-8 %v", len(h.Value), h.Truncated, utf8.ValidString(h.Value))
		}
	}
	if m.RecentDeadLetters("other") != nil {
		t.Error("a route with no dead letters has some")
	}

	// With RecentValues: the first RecentValueBytes of each, and the full
	// length; a sink dead letter keeps its output's headers and target.
	m2 := &Manager{cfg: Config{RecentValues: true}}
	r2 := &route{m: m2, name: "big", def: &rules.Route{Name: "big", Source: rules.Source{Topic: "big"}}}
	big := []byte(strings.Repeat("v", 3000))
	r2.sinkDeadLetter(&kgo.Record{Topic: "big.out", Key: []byte("k"), Value: big, Timestamp: ts,
		Headers: []kgo.RecordHeader{{Key: HeaderWindow, Value: []byte("1-2")}, {Key: HeaderSource, Value: []byte("big/0/7")}}},
		fmt.Errorf("MESSAGE_TOO_LARGE"), false)
	got = m2.RecentDeadLetters("big")
	if len(got) != 1 {
		t.Fatalf("%d sink dead letters kept, want 1", len(got))
	}
	d := got[0]
	if !d.ValuesKept || string(d.Key) != "k" || len(d.Value) != RecentValueBytes || d.ValueLen != 3000 {
		t.Fatalf("kept key %q, value %d of %d bytes", d.Key, len(d.Value), d.ValueLen)
	}
	if d.Reason != reasonSink || d.Target != "big.out" || d.Topic != "big" || d.Offset != 7 || !strings.Contains(d.Error, "MESSAGE_TOO_LARGE") {
		t.Fatalf("sink dead letter: %+v", d)
	}
	if len(d.Headers) != 1 || d.Headers[0].Key != HeaderWindow {
		t.Fatalf("sink dead letter headers: %+v", d.Headers)
	}
	// A dead letter refused in turn is not a second entry.
	r2.sinkDeadLetter(r2.sinkDeadLetter(&kgo.Record{Topic: "big.out"}, fmt.Errorf("x"), false), fmt.Errorf("y"), true)
	if n := len(m2.RecentDeadLetters("big")); n != 2 {
		t.Fatalf("%d entries after one more sink dead letter refused in turn, want 2", n)
	}
}

// Partitions record at once while the page reads (run with -race).
func TestRecentDeadLettersConcurrent(t *testing.T) {
	m := &Manager{}
	var wg sync.WaitGroup
	for p := range 4 {
		r := &route{m: m, name: fmt.Sprint("r", p%2)}
		wg.Go(func() {
			for i := range 200 {
				r.noteDeadLetter(dlRecord(i, nil), nil, time.Time{}, "")
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			for _, d := range m.RecentDeadLetters("r0") {
				if d.Reason != "decode" {
					t.Errorf("torn entry %+v", d)
					return
				}
			}
		}
	})
	wg.Wait()
	if n := len(m.RecentDeadLetters("r1")); n != RecentDeadLetterCount {
		t.Fatalf("r1 holds %d", n)
	}
}

func FuzzParseSourceRef(f *testing.F) {
	for _, s := range []string{"orders/2/100", "a.b-c_d/0/0", "", "/", "//", "x/1", "x/-1/-1", "x/99999999999/1", "a/b/c/4/5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		topic, p, off, ok := parseSourceRef(s)
		if !ok {
			return
		}
		rest, ok := strings.CutPrefix(s, topic+"/")
		ps, offs, ok2 := strings.Cut(rest, "/")
		pp, err1 := strconv.ParseInt(ps, 10, 32)
		oo, err2 := strconv.ParseInt(offs, 10, 64)
		if !ok || !ok2 || err1 != nil || err2 != nil || int32(pp) != p || oo != off || p < 0 || off < 0 || strings.Contains(offs, "/") {
			t.Fatalf("%q parsed as %q %d %d", s, topic, p, off)
		}
	})
}

// Against a broker: the ring holds what the dead-letter topic received,
// decode failures and an output the brokers refused (reason sink) alike,
// with the source record's headers, the sensitive one redacted.
func TestRecentDeadLettersMatchTheTopic(t *testing.T) {
	b := startBroker(t, map[string]int{"rd": 1})
	createTopic(t, b, "rd.out", 1, map[string]string{"max.message.bytes": "2000"})
	auth := kgo.RecordHeader{Key: "Authorization", Value: []byte("Bearer hunter2")}
	trace := kgo.RecordHeader{Key: "x-trace", Value: []byte("t-9")}
	rs := []*kgo.Record{
		jsonRecord("rd", "0", map[string]any{"n": 0}),
		{Topic: "rd", Key: []byte("1"), Value: []byte("not json"), Headers: []kgo.RecordHeader{auth, trace}},
		jsonRecord("rd", "2", map[string]any{"n": 2, "pad": strings.Repeat("x", 3000)}),
		jsonRecord("rd", "3", map[string]any{"n": 3}),
	}
	b.produce(t, rs...)
	sensitive := regexp.MustCompile(`(?i)auth`)
	m, stop := runManagerWith(t, Config{Seeds: b.addrs, StateDir: t.TempDir(), RecentValues: true, RedactHeader: sensitive.MatchString},
		newRouteDef("rd", "v1", "rd", "rd.out"))
	defer stop()
	dlq := b.consume(t, "rd.dlq", 2, 20*time.Second, 300*time.Millisecond)
	if len(dlq) != 2 {
		t.Fatalf("dead-letter topic holds %d records, want 2", len(dlq))
	}
	var got []DeadLetterInfo
	waitFor(t, 10*time.Second, "two recent dead letters", func() bool {
		got = m.RecentDeadLetters("rd")
		return len(got) == 2
	})
	byReason := map[string]DeadLetterInfo{}
	for _, d := range got {
		byReason[d.Reason] = d
	}
	for _, rec := range dlq {
		d, ok := byReason[header(rec, HeaderReason)]
		if !ok {
			t.Fatalf("dead letter with reason %q is not in the ring: %+v", header(rec, HeaderReason), got)
		}
		if src := fmt.Sprintf("%s/%d/%d", d.Topic, d.Partition, d.Offset); src != header(rec, HeaderSource) {
			t.Errorf("%s: ring source %s, topic %s", d.Reason, src, header(rec, HeaderSource))
		}
		if d.Error != header(rec, HeaderError) || d.Step != header(rec, HeaderStep) {
			t.Errorf("%s: ring error %q step %q, topic %q %q", d.Reason, d.Error, d.Step, header(rec, HeaderError), header(rec, HeaderStep))
		}
		if string(d.Key) != string(rec.Key) || d.ValueLen != len(rec.Value) || string(d.Value) != string(rec.Value[:min(len(rec.Value), RecentValueBytes)]) {
			t.Errorf("%s: ring key %q value %d/%d bytes, topic %q %d bytes", d.Reason, d.Key, len(d.Value), d.ValueLen, rec.Key, len(rec.Value))
		}
	}
	dec := byReason["decode"]
	if len(dec.Headers) != 2 || dec.Headers[0] != (HeaderInfo{Key: "Authorization", Value: Redacted, Redacted: true}) ||
		dec.Headers[1] != (HeaderInfo{Key: "x-trace", Value: "t-9"}) || dec.Offset != 1 {
		t.Errorf("decode dead letter: %+v", dec)
	}
	if sink := byReason[reasonSink]; sink.Target != "rd.out" || sink.Offset != 2 {
		t.Errorf("sink dead letter: %+v", sink)
	}
}

func TestClip(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abcdef", 3, "abc"},
		{"aé", 2, "a"},                    // é cut short
		{"aéb", 3, "aé"},                  // é whole
		{"a😀", 4, "a"},                    // a 4-byte rune cut short
		{"\xff\xfe\xfd\xfc", 2, "\uFFFD"}, // not UTF-8: a run replaced, not dropped
	} {
		if got := clip([]byte(c.in), c.n); got != c.want {
			t.Errorf("clip(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
