package main

// A route's own status page: GET /route/NAME. Its state and partitions as
// on the main page, its rule file as it is on disk now with the lines and
// columns its errors point at marked, and its last dead letters with their
// headers (sensitive values redacted when they were recorded) and, only
// with admin.show_records, their keys and values.

import (
	"fmt"
	"html/template"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/rules"
)

// millisTime is how the page writes a dead letter's times.
const millisTime = "2006-01-02T15:04:05.000Z07:00"

// maxRuleFileBytes bounds the rule file shown on a route's page.
const maxRuleFileBytes = 256 << 10

type routePageView struct {
	Version, Now, NotReady, TrendWindow string
	Ready                               bool
	Route                               routeView
	// The rule file, line by line; FileNote says why it is not shown, or
	// that it is cut short.
	Lines    []srcLine
	FileNote string
	// ErrorRefs are the places in the rule file its errors point at.
	ErrorRefs []errorRef
	Recent    []deadLetterView
	RecentMax int
}

// srcLine is one line of the rule file. A line an error points at is cut
// around the column: Before, At (the character there, or empty past the
// end of the line) and After.
type srcLine struct {
	N                 int
	Text              string
	Err               bool
	Before, At, After string
	Msgs              []string
}

type errorRef struct {
	Line, Col int
	Msg       string
}

type deadLetterView struct {
	At, Reason, Step, Error, Source, Target, Timestamp string
	Headers                                            []pipeline.HeaderInfo
	ValuesKept                                         bool
	Key, KeyNote, Value, ValueNote                     string
}

// pageOf is the name under /route/ of a route's page.
func pageOf(rs pipeline.RouteStatus) string {
	if rs.Name != "" {
		return rs.Name
	}
	return filepath.Base(rs.File)
}

func (s *statusPage) serveRoute(w http.ResponseWriter, r *http.Request, ready func() (bool, string), routes func() any,
	deadLetters func(string) []pipeline.DeadLetterInfo) {
	name := r.PathValue("name")
	var rs *pipeline.RouteStatus
	if routes != nil {
		all, _ := routes().([]pipeline.RouteStatus)
		for i := range all {
			if all[i].Name == name {
				rs = &all[i]
				break
			}
		}
		for i := range all {
			if rs == nil && all[i].Name == "" && pageOf(all[i]) == name {
				rs = &all[i]
			}
		}
	}
	if rs == nil {
		http.Error(w, fmt.Sprintf("no route %q: see / for the routes", name), http.StatusNotFound)
		return
	}
	now := time.Now()
	v := routePageView{Version: version, Now: now.UTC().Format(time.RFC3339), RecentMax: pipeline.RecentDeadLetterCount}
	v.Ready, v.NotReady = ready()
	fams, err := s.reg.Gather()
	if err != nil && len(fams) == 0 {
		http.Error(w, "gather metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	v.Route = routeViewOf(*rs, indexMetrics(fams), now)
	v.Route.Trends = s.trends.routeTrends(rs.Name, now)
	v.TrendWindow = s.trends.spanText(now)
	v.ErrorRefs = errorRefs(rs.File, rs.RuleError+"\n"+rs.LastError)
	v.Lines, v.FileNote = ruleFileLines(rs.File, v.ErrorRefs)
	if deadLetters != nil && rs.Name != "" {
		for _, d := range deadLetters(rs.Name) {
			v.Recent = append(v.Recent, deadLetterViewOf(d))
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := statusTmpl().ExecuteTemplate(w, "route.html", v); err != nil {
		fmt.Fprintf(w, "<p>render: %s</p>", template.HTMLEscapeString(err.Error()))
	}
}

// errorRefs finds "FILE:LINE[:COL]: message" in text (rule errors come
// one per line or joined by "; "), in order, one per place.
func errorRefs(file, text string) []errorRef {
	if file == "" {
		return nil
	}
	re := regexp.MustCompile(regexp.QuoteMeta(file) + `:(\d+)(?::(\d+))?: `)
	locs := re.FindAllStringSubmatchIndex(text, -1)
	var out []errorRef
	seen := map[[2]int]bool{}
	for i, l := range locs {
		line, _ := strconv.Atoi(text[l[2]:l[3]])
		col := 0
		if l[4] >= 0 {
			col, _ = strconv.Atoi(text[l[4]:l[5]])
		}
		end := len(text)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		msg := text[l[1]:end]
		if j := strings.IndexByte(msg, '\n'); j >= 0 {
			msg = msg[:j]
		}
		msg = strings.TrimSuffix(strings.TrimSpace(msg), ";")
		if k := [2]int{line, col}; line > 0 && !seen[k] {
			seen[k] = true
			out = append(out, errorRef{Line: line, Col: col, Msg: msg})
		}
	}
	return out
}

// ruleFileLines reads the rule file as it is on disk now and marks the
// places refs point at.
func ruleFileLines(file string, refs []errorRef) ([]srcLine, string) {
	if file == "" {
		return nil, "no rule file"
	}
	// Read as the loader reads it: a file that resolves out of the rules
	// directory (a symlink to /proc/self/environ), is not a regular file
	// or is too large is not shown, whatever it holds.
	b, err := rules.ReadConfined(filepath.Dir(file), file, rules.MaxRuleFileBytes)
	if err != nil {
		return nil, "cannot read it: " + err.Error()
	}
	note := ""
	if len(b) > maxRuleFileBytes {
		b = b[:maxRuleFileBytes]
		note = fmt.Sprintf("only its first %d KiB are shown", maxRuleFileBytes>>10)
	}
	return markLines(string(b), refs), note
}

// markLines splits text into lines and marks the places refs point at.
func markLines(text string, refs []errorRef) []srcLine {
	text = strings.ToValidUTF8(strings.TrimSuffix(text, "\n"), "\uFFFD")
	var lines []srcLine
	for i, l := range strings.Split(text, "\n") {
		lines = append(lines, srcLine{N: i + 1, Text: strings.TrimSuffix(l, "\r")})
	}
	for _, ref := range refs {
		if ref.Line < 1 || ref.Line > len(lines) {
			continue
		}
		sl := &lines[ref.Line-1]
		sl.Msgs = append(sl.Msgs, ref.Msg)
		if sl.Err {
			continue // the first place on a line is the one marked
		}
		sl.Err = true
		// YAML columns count characters from 1.
		rs := []rune(sl.Text)
		c := min(max(ref.Col, 1), len(rs)+1) - 1
		sl.Before = string(rs[:c])
		if c < len(rs) {
			sl.At, sl.After = string(rs[c]), string(rs[c+1:])
		}
	}
	return lines
}

func deadLetterViewOf(d pipeline.DeadLetterInfo) deadLetterView {
	v := deadLetterView{At: d.At.UTC().Format(millisTime), Reason: d.Reason, Step: d.Step, Error: d.Error,
		Target: d.Target, Headers: d.Headers, ValuesKept: d.ValuesKept}
	if v.Error == "" {
		v.Error = "–"
	}
	switch {
	case d.Topic == "":
		v.Source = "–"
	case d.Offset < 0:
		v.Source = d.Topic
	default:
		v.Source = fmt.Sprintf("%s / %d / %d", d.Topic, d.Partition, d.Offset)
	}
	v.Timestamp = "–"
	if !d.Timestamp.IsZero() && d.Timestamp.UnixMilli() > 0 {
		v.Timestamp = d.Timestamp.UTC().Format(millisTime)
	}
	if d.ValuesKept {
		v.Key, v.KeyNote = shownBytes(d.Key, d.KeyLen)
		v.Value, v.ValueNote = shownBytes(d.Value, d.ValueLen)
	}
	return v
}

// shownBytes is a kept key or value as text, and a note on what of it is
// shown: text when it is UTF-8, else hex.
func shownBytes(b []byte, full int) (string, string) {
	var note string
	if full == 0 {
		return "", "empty"
	}
	if len(b) < full {
		note = fmt.Sprintf("first %d of %d bytes", len(b), full)
	}
	if utf8.Valid(b) || (len(b) < full && utf8.Valid(trimPartialRune(b))) {
		return string(trimPartialRune(b)), note
	}
	if note != "" {
		note += ", "
	}
	return fmt.Sprintf("%x", b), note + "hex: not UTF-8"
}

// trimPartialRune drops a rune cut short at the end of b.
func trimPartialRune(b []byte) []byte {
	for i := 1; i <= utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if r, _ := utf8.DecodeRune(b[len(b)-i:]); r == utf8.RuneError && !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}
