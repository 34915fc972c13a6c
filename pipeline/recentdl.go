package pipeline

// The last dead letters of each route, kept in memory for the status page
// (a route's own page): a bounded ring per route name, recorded where a
// dead letter is made (deadletter.go). Header values whose names
// Config.RedactHeader matches are never kept; keys and values are kept
// (their first RecentValueBytes) only with Config.RecentValues.

import (
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
)

// Bounds of what the ring keeps.
const (
	// RecentDeadLetterCount is how many dead letters a route keeps.
	RecentDeadLetterCount = 20
	// RecentValueBytes bounds a kept key or value.
	RecentValueBytes = 1024
	// recentHeaderBytes bounds a kept header name or value, and
	// recentHeaders the headers kept per dead letter.
	recentHeaderBytes = 256
	recentHeaders     = 32
	// recentErrorBytes bounds a kept error text.
	recentErrorBytes = 1024
)

// Redacted replaces the value of a header whose name is sensitive.
const Redacted = "REDACTED"

// DeadLetterInfo is one recent dead letter of a route.
type DeadLetterInfo struct {
	At     time.Time // when it became a dead letter
	Reason string    // rtproxy-reason: decode, error, sink, ...
	Step   string    // rtproxy-step
	Error  string    // rtproxy-error, at most 1 KiB
	// Topic, Partition and Offset name the record it came from
	// (rtproxy-source); Offset is -1 when unknown. Target is the topic an
	// output the brokers refused was meant for (reason sink).
	Topic     string
	Partition int32
	Offset    int64
	Target    string
	Timestamp time.Time // the record's timestamp
	// Headers are the record's headers (rtproxy's own reason headers are
	// the fields above), a sensitive one's value replaced by Redacted.
	Headers []HeaderInfo
	// Key and Value are kept only with Config.RecentValues, their first
	// RecentValueBytes; KeyLen and ValueLen are their full lengths.
	Key, Value       []byte
	KeyLen, ValueLen int
	ValuesKept       bool
}

// HeaderInfo is a header of a DeadLetterInfo.
type HeaderInfo struct {
	Key, Value string
	Redacted   bool // Value is Redacted, not the header's value
	Truncated  bool // Value is the first 256 bytes of a longer one
}

// recentDeadLetters holds the rings; its zero value is ready.
type recentDeadLetters struct {
	mu    sync.Mutex
	rings map[string]*dlRing
}

type dlRing struct {
	buf  [RecentDeadLetterCount]DeadLetterInfo
	next int // where the next one goes
	n    int // how many are held
}

func (rd *recentDeadLetters) add(route string, d DeadLetterInfo) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.rings == nil {
		rd.rings = map[string]*dlRing{}
	}
	r := rd.rings[route]
	if r == nil {
		r = &dlRing{}
		rd.rings[route] = r
	}
	r.buf[r.next] = d
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// list returns the route's dead letters, newest first. The entries are
// never changed once recorded, so sharing their slices is safe.
func (rd *recentDeadLetters) list(route string) []DeadLetterInfo {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	r := rd.rings[route]
	if r == nil {
		return nil
	}
	out := make([]DeadLetterInfo, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.buf[(r.next-i+len(r.buf))%len(r.buf)])
	}
	return out
}

// RecentDeadLetters returns the last dead letters (at most
// RecentDeadLetterCount) this process made for the named route, newest
// first; nil when it made none. They survive a reload of the route's rule
// file, not a restart of the process.
func (m *Manager) RecentDeadLetters(route string) []DeadLetterInfo {
	return m.recent.list(route)
}

// noteDeadLetter records dl, a dead letter about to be written, in the
// route's ring. hs are the headers of the record it came from when dl
// does not carry them; ts is that record's timestamp. shown is the error
// as the page may show it (shownError: without record values unless
// admin.show_records); dl's rtproxy-error header keeps the full text.
func (r *route) noteDeadLetter(dl *kgo.Record, hs []operators.Header, ts time.Time, shown string) {
	cfg := &r.m.cfg
	d := DeadLetterInfo{At: time.Now(), Offset: -1, Timestamp: ts, KeyLen: len(dl.Key), ValueLen: len(dl.Value)}
	var kept []HeaderInfo
	keep := func(k string, v []byte) {
		if len(kept) == recentHeaders {
			return
		}
		h := HeaderInfo{Key: clip([]byte(k), recentHeaderBytes)}
		switch {
		case cfg.RedactHeader != nil && cfg.RedactHeader(k):
			h.Value, h.Redacted = Redacted, true
		default:
			h.Value = clip(v, recentHeaderBytes)
			h.Truncated = len(v) > recentHeaderBytes
		}
		kept = append(kept, h)
	}
	for _, h := range dl.Headers {
		switch h.Key {
		case HeaderReason:
			d.Reason = string(h.Value)
		case HeaderError:
			if shown == "" {
				shown = r.shownText(string(h.Value), nil)
			}
		case HeaderStep:
			d.Step = string(h.Value)
		case HeaderTarget:
			d.Target = string(h.Value)
		case HeaderSource:
			if t, p, o, ok := parseSourceRef(string(h.Value)); ok {
				d.Topic, d.Partition, d.Offset = t, p, o
			} else {
				d.Topic = clip(h.Value, recentHeaderBytes)
			}
		case HeaderRoute:
		default:
			keep(h.Key, h.Value)
		}
	}
	for _, h := range hs {
		keep(h.Key, h.Value)
	}
	d.Error = clip([]byte(shown), recentErrorBytes)
	d.Headers = kept
	if cfg.RecentValues {
		d.ValuesKept = true
		d.Key = append([]byte(nil), dl.Key[:min(len(dl.Key), RecentValueBytes)]...)
		d.Value = append([]byte(nil), dl.Value[:min(len(dl.Value), RecentValueBytes)]...)
	}
	r.m.recent.add(r.name, d)
}

// parseSourceRef reads sourceRef's "topic/partition/offset" (topic names
// have no '/'); ok is false when s is not one.
func parseSourceRef(s string) (topic string, part int32, off int64, ok bool) {
	rest, o, ok1 := cutLast(s, '/')
	t, p, ok2 := cutLast(rest, '/')
	pn, err1 := strconv.ParseInt(p, 10, 32)
	on, err2 := strconv.ParseInt(o, 10, 64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || pn < 0 || on < 0 {
		return "", 0, 0, false
	}
	return t, int32(pn), on, true
}

func cutLast(s string, sep byte) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// clip is b as text, cut to at most n bytes without a rune cut short at
// the end, bytes that are not UTF-8 replaced by U+FFFD.
func clip(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
		for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
			if utf8.RuneStart(b[len(b)-i]) {
				if !utf8.FullRune(b[len(b)-i:]) {
					b = b[:len(b)-i]
				}
				break
			}
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
