package main

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/pipeline"
)

// A route's page: its state, its rule file with the place its error points
// at marked, and its last dead letters, escaped; keys and values only when
// they were kept (admin.show_records); 404 for a route that is not there.
func TestRoutePage(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "risk.yaml")
	body := "route: risk\nsource: { topic: pay, format: json }\nsink: { topic: pay.risk }\nsteps:\n  - filter: value.amount >>> 100 # <b>\n"
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	never := filepath.Join(dir, "never.yaml")
	if err := os.WriteFile(never, []byte("route: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := newAdmin("127.0.0.1:0", newRegistry(), slog.New(slog.DiscardHandler), false)
	if err != nil {
		t.Fatal(err)
	}
	go a.serve()
	defer a.srv.Close()
	a.setReady(func() (bool, string) { return true, "" })
	a.setRoutes(func() any {
		return []pipeline.RouteStatus{
			{Name: "risk", File: file, Source: "pay", Sink: "pay.risk", State: "running",
				Sinks:     []pipeline.SinkStatus{{Name: "pay.risk", Target: "pay.risk", Format: "avro", Out: 1234, Errors: 5}},
				RuleError: file + ":5:27: filter does not compile: unexpected token (near `>>> 100`)\n" + file + ":9:1: past the end",
				Owned:     []pipeline.OwnedPartition{{Topic: "pay", Partition: 1, DoneOffset: 42, Lag: 3}}},
			{File: never, State: "error", RuleError: never + ":1:8: did not find expected node content"},
			{File: filepath.Join(dir, "odd #1?.yaml"), State: "error", RuleError: "odd"},
		}
	})
	ts := time.UnixMilli(1_767_000_000_000)
	a.setDeadLetters(func(route string) []pipeline.DeadLetterInfo {
		if route != "risk" {
			return nil
		}
		return []pipeline.DeadLetterInfo{
			{At: ts, Reason: "decode", Step: "source", Error: "<script>alert(1)</script>", Topic: "pay", Partition: 1, Offset: 41, Timestamp: ts,
				Headers:    []pipeline.HeaderInfo{{Key: "authorization", Value: pipeline.Redacted, Redacted: true}, {Key: "x-trace", Value: "<i>t1</i>"}},
				ValuesKept: true, Key: []byte("k1"), KeyLen: 2, Value: []byte("{\"a\":\"<img>\"}"), ValueLen: 5000},
			{At: ts, Reason: "sink", Step: "sink", Error: "too large", Target: "pay.risk", Topic: "pay", Partition: 0, Offset: 7,
				ValuesKept: true, Value: []byte{0xff, 0x00}, ValueLen: 2},
		}
	})
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + a.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, page := get("/route/risk")
	if code != 200 {
		t.Fatalf("GET /route/risk: %d\n%s", code, page)
	}
	for _, want := range []string{
		"<h1>route risk</h1>", `http-equiv="refresh"`, `class="state-running"`, "pay → pay.risk", ">42<", ">3<",
		// its sinks, with their counts
		`<tr><td>pay.risk</td><td>pay.risk</td><td>avro</td><td class="num">1234</td><td class="num">5</td></tr>`,
		// the error's place, marked: line 5, column 27 is the second '>'
		`<span class="line errline" id="L5"><span class="ln">5</span>  - filter: value.amount &gt;<mark>&gt;</mark>&gt; 100 # &lt;b&gt;</span>`,
		`↑ filter does not compile: unexpected token (near `, `href="#L5"`, "line 5:27",
		// line 9 is past the file's end: listed with the error, not marked
		"past the end",
		// the dead letters, escaped
		"&lt;script&gt;alert(1)&lt;/script&gt;", "pay / 1 / 41", `<span class="redacted">redacted</span>`, "&lt;i&gt;t1&lt;/i&gt;",
		"<th scope=\"col\">value</th>", "{&#34;a&#34;:&#34;&lt;img&gt;&#34;}", "first 13 of 5000 bytes", "(meant for pay.risk)", "ff00", "hex: not UTF-8",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("/route/risk lacks %q:\n%s", want, page)
		}
	}
	for _, bad := range []string{"<script>", "<i>", "<img>", "<b>", pipeline.Redacted} {
		if strings.Contains(page, bad) {
			t.Errorf("/route/risk holds %q", bad)
		}
	}

	// The main page links to it, and to the line of the error.
	_, home := get("/")
	for _, want := range []string{`href="/route/risk"`, `href="/route/risk#L5"`, `href="/route/never.yaml"`, "never.yaml (refused)"} {
		if !strings.Contains(home, want) {
			t.Errorf("/ lacks %q:\n%s", want, home)
		}
	}

	// A file that never compiled has a page under its file name.
	code, page = get("/route/never.yaml")
	if code != 200 || !strings.Contains(page, `id="L1"`) || !strings.Contains(page, "<mark>[</mark>") || !strings.Contains(page, "None since this process started.") {
		t.Errorf("GET /route/never.yaml: %d\n%s", code, page)
	}
	// A name that is not a plain path segment is escaped in the link.
	if !strings.Contains(home, `href="/route/odd%20%231%3F.yaml"`) {
		t.Errorf("/ does not escape the link to odd #1?.yaml:\n%s", home)
	}
	if code, page := get("/route/odd%20%231%3F.yaml"); code != 200 || !strings.Contains(page, "cannot read it") {
		t.Errorf("GET /route/odd%%20%%231%%3F.yaml: %d\n%s", code, page)
	}
	if code, page := get("/route/nope"); code != 404 || !strings.Contains(page, `no route "nope"`) {
		t.Errorf("GET /route/nope: %d %q", code, page)
	}

	// Without kept values the page says why there are none.
	a.setDeadLetters(func(string) []pipeline.DeadLetterInfo {
		return []pipeline.DeadLetterInfo{{At: ts, Reason: "decode", ValueLen: 10, Headers: []pipeline.HeaderInfo{{Key: "x", Value: "y"}}}}
	})
	_, page = get("/route/risk")
	if !strings.Contains(page, "admin.show_records is off") || strings.Contains(page, `<th scope="col">value</th>`) {
		t.Errorf("without kept values:\n%s", page)
	}
}

func TestErrorRefs(t *testing.T) {
	f := "/r/a.yaml"
	got := errorRefs(f, f+":3:7: bad one; "+f+":4: bad two\n/r/other.yaml:1:1: elsewhere\n"+f+":3:7: bad one again; "+f+": no line")
	if len(got) != 2 || got[0] != (errorRef{3, 7, "bad one"}) || got[1] != (errorRef{4, 0, "bad two"}) {
		t.Fatalf("errorRefs: %+v", got)
	}
	if errorRefs("", "x:1:1: y") != nil {
		t.Fatal("refs without a file")
	}
}

// Any rule file and any error text give a page: the places found are in
// the file's lines, a marked line is still the whole line, and the page
// renders.
func FuzzRouteSource(f *testing.F) {
	const file = "/r/f.yaml"
	f.Add("route: r\nsteps:\n  - filter: valu.n > 1\n", file+":3:13: unknown name valu")
	f.Add("a\r\nb\xff\n", file+":2:9: x; "+file+":2:1: y\n"+file+":99999999999999999999:1: z")
	f.Add("", file+":1:1: empty")
	f.Add("é€😀\n", file+":1:3: wide; "+file+": no line")
	f.Fuzz(func(t *testing.T, text, errText string) {
		refs := errorRefs(file, errText)
		lines := markLines(text, refs)
		for _, r := range refs {
			if r.Line < 1 || r.Col < 0 {
				t.Fatalf("ref %+v", r)
			}
		}
		for _, l := range lines {
			if l.Err && l.Before+l.At+l.After != l.Text {
				t.Fatalf("line %d marked as %q|%q|%q, is %q", l.N, l.Before, l.At, l.After, l.Text)
			}
		}
		v := routePageView{Route: routeView{Name: "r", File: file, RuleError: errText}, Lines: lines, ErrorRefs: refs}
		if err := statusTmpl().ExecuteTemplate(io.Discard, "route.html", v); err != nil {
			t.Fatal(err)
		}
	})
}

// docs/OPERATIONS.md's "The status page" says what the code does: the
// default pattern, the headers it redacts and keeps, a config example that
// loads, and screenshots that are there and small.
func TestOperationsDocStatusPage(t *testing.T) {
	doc := readRepoFile(t, "docs/OPERATIONS.md")
	i := strings.Index(doc, "\n## The status page\n")
	if i < 0 {
		t.Fatal("docs/OPERATIONS.md has no section \"The status page\"")
	}
	sec := doc[i+1:]
	sec = sec[:strings.Index(sec, "\n## ")]
	blocks := regexp.MustCompile("(?s)```(\\w*)\n(.*?)```").FindAllStringSubmatch(sec, -1)
	if len(blocks) != 2 {
		t.Fatalf("want the pattern block and the yaml example, found %d blocks", len(blocks))
	}
	if got := strings.TrimSpace(blocks[0][2]); got != config.DefaultRedactHeaders {
		t.Errorf("the documented default pattern is %q, the code's %q", got, config.DefaultRedactHeaders)
	}
	c := config.Default()
	if err := c.Parse("OPERATIONS.md", []byte(blocks[1][2])); err != nil {
		t.Fatalf("the yaml example: %v", err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("the yaml example: %v", err)
	}
	if ext, _ := c.Admin.RedactPattern(); ext == nil || !ext.MatchString("X-Tenant-Id") || !ext.MatchString("Authorization") {
		t.Errorf("the yaml example's pattern %q does not extend the default", c.Admin.RedactHeaders)
	}
	re, _ := config.Default().Admin.RedactPattern()
	names := func(para string) []string {
		var out []string
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(para, -1) {
			out = append(out, m[1])
		}
		return out
	}
	so := strings.Join(strings.Fields(sec[strings.Index(sec, "so `Authorization`"):]), " ")
	redacted, kept, _ := strings.Cut(so[:strings.Index(so, "are not.")], "are redacted, and")
	if len(names(redacted)) < 10 || len(names(kept)) < 3 {
		t.Fatalf("cannot read the header examples: %q / %q", redacted, kept)
	}
	for _, n := range names(redacted) {
		if !re.MatchString(n) {
			t.Errorf("the docs say %s is redacted by default; it is not", n)
		}
	}
	for _, n := range names(kept) {
		if re.MatchString(n) {
			t.Errorf("the docs say %s is not redacted by default; it is", n)
		}
	}
	for _, m := range regexp.MustCompile(`\]\((status-page[^)]*\.png)\)`).FindAllStringSubmatch(sec, -1) {
		fi, err := os.Stat(filepath.Join("..", "..", "docs", m[1]))
		if err != nil || fi.Size() > 200<<10 {
			t.Errorf("screenshot docs/%s: %v, want it there and under 200 KiB", m[1], err)
		}
	}
}
