package main

// The status pages in a real browser: the rtproxy binary in front of a
// kfake broker process, a route with traffic that sends records to its
// dead-letter topic, and headless Chromium (Debian's chromium package,
// which .ci/deps.sh installs) reading what the pages render.

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// chromiumPath finds Debian's chromium. Missing, the test fails under
// CI=true (.ci/deps.sh installs it) and is skipped elsewhere.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium is not installed; `make deps` (.ci/deps.sh) installs Debian's chromium package"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " — CI=true, so a missing browser is a failure")
	}
	t.Skip(msg)
	return ""
}

// The secrets the traffic carries, which no page may show.
const (
	secretHeader = "Bearer s3cr3t-token-4711"
	secretValue  = "card=4111111111111111"
)

func TestStatusPageInBrowser(t *testing.T) {
	chrome := chromiumPath(t)
	k := testkit.StartKfakeWith(t, testkit.KfakeOpts{Topics: map[string]int{"payments": 3, "payments.big": 3, "payments.dlq": 3}})
	rulesDir := t.TempDir()
	rule := `# Payments over 100, as JSON.
route: payments
source: { topic: payments, format: json, start: earliest }
sink: { topic: payments.big }
steps:
  - filter: value.amount > 100
`
	broken := "route: broken\nsource: { topic: payments, format: json }\nsink: { topic: payments.broken }\nsteps:\n  - filter: value.amount >>> 100\n"
	for name, body := range map[string]string{"payments.yaml": rule, "broken.yaml": broken} {
		if err := os.WriteFile(filepath.Join(rulesDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := startRunUpstream(t, rulesDir, k.Addrs)

	// Traffic through the proxy: 10 payments, and 3 records that are not
	// JSON, carrying a credential header, which become dead letters.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.listen), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 10 {
		v := fmt.Sprintf(`{"id":%d,"amount":%d}`, i, i*30)
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "payments", Key: []byte(strconv.Itoa(i)), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	for i := range 3 {
		r := &kgo.Record{Topic: "payments", Key: fmt.Appendf(nil, "bad-%d", i), Value: []byte(secretValue + " <b>not json</b>"),
			Headers: []kgo.RecordHeader{{Key: "Authorization", Value: []byte(secretHeader)}, {Key: "x-trace-id", Value: []byte("trace-42")}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce bad %d: %v", i, err)
		}
	}
	waitMetric(t, p.admin, `rtproxy_pipeline_dead_letters_total{reason="decode",route="payments"} 3`)
	waitMetric(t, p.admin, `rtproxy_pipeline_records_out_total{route="payments"} 6`)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome),
		chromedp.NoSandbox, // chromium refuses to run as root with its sandbox
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer bcancel()
	shots := t.TempDir()

	// The main page.
	home := loadPage(t, bctx, p.admin+"/", filepath.Join(shots, "status.png"))
	checkAccessible(t, "/", home)
	for _, want := range []string{"rtproxy status", "payments", "running", "payments → payments.big", "decode", "broken.yaml (refused)"} {
		if !strings.Contains(home.Text, want) {
			t.Errorf("/ does not show %q:\n%s", want, home.Text)
		}
	}
	if !home.Refresh {
		t.Error("/ has no meta refresh")
	}

	// It refreshes by itself: a mark left in the page's window is gone
	// once the page has loaded again.
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[int](`window.rtproxyMark = 1`)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		marked, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.rtproxyMark === 1`))
		if err == nil && !marked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page did not reload itself within 20s (%v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The route's page, reached through its link.
	var at string
	for attempt := 1; ; attempt++ {
		err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`td a[href="/route/payments"]`)), chromedp.WaitVisible(chromedp.CSS("#dead-letters")))
		if err == nil {
			at, err = chromedp.Run(bctx, chromedp.Location())
		}
		if err == nil || attempt == 3 {
			if err != nil || at != p.admin+"/route/payments" {
				t.Fatalf("following the link to payments: at %q, %v", at, err)
			}
			break
		}
		t.Logf("follow the link: %v; again", err) // the page reloaded under the click
	}
	route := loadPage(t, bctx, p.admin+"/route/payments", filepath.Join(shots, "route.png"))
	checkAccessible(t, "/route/payments", route)
	for _, want := range []string{"route payments", "running", "decode", "source", "Authorization", "redacted",
		"x-trace-id", "trace-42", "admin.show_records is off", "filter: value.amount > 100", "payments / "} {
		if !strings.Contains(route.Text, want) {
			t.Errorf("/route/payments does not show %q:\n%s", want, route.Text)
		}
	}
	if route.DeadLetterRows != 3 {
		t.Errorf("/route/payments lists %d dead letters, want 3", route.DeadLetterRows)
	}
	for _, page := range []pageFacts{home, route} {
		for _, secret := range []string{"s3cr3t", secretValue, "not json", "bad-0"} {
			if strings.Contains(page.HTML, secret) {
				t.Errorf("%s shows %q (a redacted header value, or a record key or value without admin.show_records)", page.URL, secret)
			}
		}
	}
	if !home.Links["/route/payments"] {
		t.Errorf("/ has no link to /route/payments: %v", home.Links)
	}

	// The refused file's page marks where its error points.
	bad := loadPage(t, bctx, p.admin+"/route/broken.yaml", filepath.Join(shots, "broken.png"))
	checkAccessible(t, "/route/broken.yaml", bad)
	if bad.MarkLine != "L5" || !strings.Contains(bad.Text, "rule file refused") {
		t.Errorf("/route/broken.yaml: the error mark is on %q, want L5:\n%s", bad.MarkLine, bad.Text)
	}
	checkTrends(t, bctx, cl, p, shots)
	t.Logf("screenshots in %s", shots)
	cl.Close()
	p.stop(t)
}

// checkTrends: with traffic flowing, the pages grow sparklines (sampled
// every trendInterval): the proxy's requests and bytes per second, and the
// route's records in and out per second, lag and p99, each an SVG the
// browser lays out, named by its aria-label with its last, lowest and
// highest value, the same values written beside it. The home page's
// screenshot is docs/statuspage.png (written again with
// RTPROXY_UPDATE_SCREENSHOT=1).
func checkTrends(t *testing.T, ctx context.Context, cl *kgo.Client, p *proc, shots string) {
	t.Helper()
	// Traffic that rises over the samples, so the lines have a shape.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			for j := range 1 + i/10 {
				v := fmt.Sprintf(`{"id":%d,"amount":%d}`, 1000+i*100+j, 50+i*7%300)
				cl.Produce(context.Background(), &kgo.Record{Topic: "payments", Value: []byte(v)}, nil)
			}
		}
	}()
	defer func() { close(stop); <-done }()

	// Three samples with rates take 3-4 intervals from the proxy's start.
	var home pageFacts
	deadline := time.Now().Add(4*trendInterval + 20*time.Second)
	for {
		home = loadPage(t, ctx, p.admin+"/", filepath.Join(shots, "status.png"))
		n := 0
		for _, sp := range home.Sparks {
			if strings.HasPrefix(sp.Label, "records in per second") && sp.Lines > 0 && !strings.Contains(sp.Label, "(1 samples)") && !strings.Contains(sp.Label, "(2 samples)") {
				n++
			}
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sparkline of records in per second with 3 samples within %v: %+v", time.Until(deadline), home.Sparks)
		}
		time.Sleep(trendInterval / 2)
	}
	checkAccessible(t, "/ with trends", home)
	labels := map[string]sparkFacts{}
	for _, sp := range home.Sparks {
		name, _, _ := strings.Cut(sp.Label, " over the last ")
		labels[name] = sp
		if sp.Role != "img" || sp.Width < 100 || sp.Height < 20 {
			t.Errorf("sparkline %q: role %q, laid out %.0fx%.0f", sp.Label, sp.Role, sp.Width, sp.Height)
		}
	}
	for _, want := range []string{"requests per second", "bytes per second client → broker", "bytes per second broker → client",
		"records in per second", "records out per second", "lag (records)", "processing p99"} {
		sp, ok := labels[want]
		if !ok {
			t.Errorf("no sparkline for %q: %v", want, home.Sparks)
			continue
		}
		if !regexp.MustCompile(`: (no samples yet|last \S.*, lowest \S.*, highest \S.*)$`).MatchString(sp.Label) {
			t.Errorf("sparkline label %q does not say last, lowest and highest", sp.Label)
		}
	}
	if sp := labels["requests per second"]; sp.Lines == 0 {
		t.Errorf("no line for requests per second: %+v", sp)
	}
	// The values are text beside the graphic too (readable without it).
	for _, want := range []string{"since the start", "lowest", "highest", "records in per second", "/s"} {
		if !strings.Contains(home.Text, want) {
			t.Errorf("/ does not write %q beside the sparklines", want)
		}
	}
	if os.Getenv("RTPROXY_UPDATE_SCREENSHOT") == "1" {
		b, err := os.ReadFile(filepath.Join(shots, "status.png"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "statuspage.png"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log("wrote docs/statuspage.png")
	}
	if b, err := os.ReadFile(filepath.Join("..", "..", "docs", "statuspage.png")); err != nil || len(b) < 8 || string(b[1:4]) != "PNG" {
		t.Errorf("docs/statuspage.png (the screenshot docs/OPERATIONS.md shows) is missing or not a PNG: %v", err)
	}

	route := loadPage(t, ctx, p.admin+"/route/payments", filepath.Join(shots, "route-trends.png"))
	checkAccessible(t, "/route/payments with trends", route)
	n := 0
	for _, sp := range route.Sparks {
		if strings.HasPrefix(sp.Label, "records in per second") || strings.HasPrefix(sp.Label, "lag (records)") {
			n++
		}
	}
	if n != 2 || !strings.Contains(route.Text, "Trends") {
		t.Errorf("/route/payments: %d of its sparklines found: %+v", n, route.Sparks)
	}
}

// With admin.show_records on, a route's page shows its dead letters' keys
// and values; admin.redact_headers replaces the default pattern. Both come
// from the environment, through the binary to the pipeline's ring.
func TestStatusPageShowRecords(t *testing.T) {
	k := testkit.StartKfakeWith(t, testkit.KfakeOpts{Topics: map[string]int{"orders": 1, "orders.out": 1, "orders.dlq": 1}})
	rulesDir := t.TempDir()
	rule := "route: orders\nsource: { topic: orders, format: json }\nsink: { topic: orders.out }\n"
	if err := os.WriteFile(filepath.Join(rulesDir, "orders.yaml"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startRunUpstream(t, rulesDir, k.Addrs, "RTPROXY_ADMIN_SHOW_RECORDS=true", "RTPROXY_ADMIN_REDACT_HEADERS=^x-tenant$")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.listen), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r := &kgo.Record{Topic: "orders", Key: []byte("order-<7>"), Value: []byte("{not json <at all>"),
		Headers: []kgo.RecordHeader{{Key: "X-Tenant", Value: []byte("tenant-secret")}, {Key: "authorization", Value: []byte("Basic dXNlcg==")}}}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, p.admin, `rtproxy_pipeline_dead_letters_total{reason="decode",route="orders"} 1`)
	code, page, err := httpGet(p.admin + "/route/orders")
	if err != nil || code != 200 {
		t.Fatalf("GET /route/orders: %d %v", code, err)
	}
	for _, want := range []string{"order-&lt;7&gt;", "{not json &lt;at all&gt;", `<code>X-Tenant</code>: <span class="redacted">redacted</span>`,
		"<code>authorization</code>: <code>Basic dXNlcg==</code>", "orders / 0 / 0"} {
		if !strings.Contains(page, want) {
			t.Errorf("/route/orders lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "tenant-secret") || strings.Contains(page, "admin.show_records is off") {
		t.Errorf("/route/orders shows the redacted value, or says show_records is off:\n%s", page)
	}
	cl.Close()
	p.stop(t)
}

// startRunUpstream is startRun in front of a broker process, with env
// (RTPROXY_NAME=value) added to a clean environment.
func startRunUpstream(t *testing.T, rulesDir string, upstream []string, env ...string) *proc {
	t.Helper()
	p := testkit.StartProxy(t, testkit.ProxyOpts{
		Upstream: upstream,
		RulesDir: rulesDir,
		StateDir: filepath.Join(t.TempDir(), "state"),
		Env:      env,
		CleanEnv: true,
		Binary:   rtproxyBinary(t),
	})
	return &proc{Proxy: p, listen: p.Addr, admin: p.AdminURL, brokerFirst: p.BrokerPortFirst, stateDir: p.Opts.StateDir}
}

// pageFacts is what the browser read from a page.
type pageFacts struct {
	URL            string
	HTML, Text     string
	Lang           string
	Refresh        bool
	Headings       []heading
	Tables         []tableFacts
	Colours        []colourUse
	Links          map[string]bool
	DeadLetterRows int
	MarkLine       string
	Sparks         []sparkFacts
}

// sparkFacts is one sparkline as the browser laid it out.
type sparkFacts struct {
	Label  string  `json:"label"`
	Role   string  `json:"role"`
	Lines  int     `json:"lines"`
	Width  float64 `json:"width"`
	Height float64 `json:"height"`
}

type heading struct {
	Level int    `json:"level"`
	Text  string `json:"text"`
}

type tableFacts struct {
	Headers   int `json:"headers"`
	NoScope   int `json:"noScope"`
	BodyCells int `json:"cells"`
}

type colourUse struct {
	What string `json:"what"`
	FG   string `json:"fg"`
	BG   string `json:"bg"`
	Text string `json:"text"`
}

// pageScript gathers every fact in one evaluation, so a refresh of the
// page cannot fall between two of them.
const pageScript = `(() => {
  const bgOf = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = getComputedStyle(e).backgroundColor;
      if (c && c !== 'transparent' && !/rgba\(.*, 0\)$/.test(c)) return c;
    }
    return 'rgb(255, 255, 255)';
  };
  const colours = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (![...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim() !== '')) continue;
    const cs = getComputedStyle(el);
    if (cs.display === 'none' || cs.visibility === 'hidden') continue;
    colours.push({what: el.tagName.toLowerCase() + (el.className ? '.' + String(el.className).trim().replace(/\s+/g, '.') : ''),
      fg: cs.color, bg: bgOf(el), text: el.textContent.trim().slice(0, 40)});
  }
  const mark = document.querySelector('pre.src mark');
  return {
    url: location.pathname,
    html: document.documentElement.outerHTML,
    text: document.body.innerText,
    lang: document.documentElement.getAttribute('lang') || '',
    refresh: !!document.querySelector('meta[http-equiv="refresh"]'),
    headings: [...document.querySelectorAll('h1,h2,h3,h4,h5,h6')].map(h => ({level: +h.tagName[1], text: h.textContent.trim()})),
    tables: [...document.querySelectorAll('table')].map(t => ({
      headers: t.querySelectorAll('th').length,
      noScope: [...t.querySelectorAll('th')].filter(th => !['col', 'row'].includes(th.getAttribute('scope'))).length,
      cells: t.querySelectorAll('td').length})),
    colours: colours,
    links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
    deadLetterRows: document.querySelectorAll('#dead-letters tbody tr').length,
    markLine: mark ? mark.closest('span.line').id : '',
    sparks: [...document.querySelectorAll('svg.spark')].map(g => ({label: g.getAttribute('aria-label') || '',
      role: g.getAttribute('role') || '', lines: g.querySelectorAll('polyline').length,
      width: g.getBoundingClientRect().width, height: g.getBoundingClientRect().height})),
  };
})()`

// loadPage opens url, waits for its heading, saves a full-page screenshot
// to shot and returns what the page shows.
func loadPage(t *testing.T, ctx context.Context, url, shot string) pageFacts {
	t.Helper()
	type facts struct {
		URL            string       `json:"url"`
		HTML           string       `json:"html"`
		Text           string       `json:"text"`
		Lang           string       `json:"lang"`
		Refresh        bool         `json:"refresh"`
		Headings       []heading    `json:"headings"`
		Tables         []tableFacts `json:"tables"`
		Colours        []colourUse  `json:"colours"`
		Links          []string     `json:"links"`
		DeadLetterRows int          `json:"deadLetterRows"`
		MarkLine       string       `json:"markLine"`
		Sparks         []sparkFacts `json:"sparks"`
	}
	// The page reloads itself every 5 s; a reload that falls between
	// loading and reading it (a slow machine) is a retry, not a failure.
	var raw facts
	var png []byte
	for attempt := 1; ; attempt++ {
		err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("h1")))
		if err == nil {
			raw, err = chromedp.Run(ctx, chromedp.Evaluate[facts](pageScript))
		}
		if err == nil {
			png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
		}
		if err == nil {
			break
		}
		if attempt == 3 || ctx.Err() != nil {
			t.Fatalf("load %s in chromium: %v", url, err)
		}
		t.Logf("load %s: %v; again", url, err)
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	f := pageFacts{URL: raw.URL, HTML: raw.HTML, Text: raw.Text, Lang: raw.Lang, Refresh: raw.Refresh, Headings: raw.Headings,
		Tables: raw.Tables, Colours: raw.Colours, Links: map[string]bool{}, DeadLetterRows: raw.DeadLetterRows, MarkLine: raw.MarkLine,
		Sparks: raw.Sparks}
	for _, l := range raw.Links {
		f.Links[l] = true
	}
	t.Logf("%s: %d headings, %d tables, %d text colours, screenshot %s (%d bytes)", url, len(f.Headings), len(f.Tables), len(f.Colours), shot, len(png))
	return f
}

// checkAccessible is the accessibility smoke check: a language, one h1
// first and no heading level skipped, header cells with a scope in every
// table, and a contrast of at least 4.5:1 (WCAG AA) for every text.
func checkAccessible(t *testing.T, page string, f pageFacts) {
	t.Helper()
	if f.Lang == "" {
		t.Errorf("%s: <html> has no lang", page)
	}
	h1 := 0
	for i, h := range f.Headings {
		if h.Level == 1 {
			h1++
		}
		if i == 0 && h.Level != 1 {
			t.Errorf("%s: the first heading is h%d %q, want h1", page, h.Level, h.Text)
		}
		if i > 0 && h.Level > f.Headings[i-1].Level+1 {
			t.Errorf("%s: h%d %q follows h%d: a level is skipped", page, h.Level, h.Text, f.Headings[i-1].Level)
		}
	}
	if h1 != 1 {
		t.Errorf("%s: %d h1 headings, want 1", page, h1)
	}
	if len(f.Tables) == 0 {
		t.Errorf("%s: no tables", page)
	}
	for i, tb := range f.Tables {
		if tb.Headers == 0 {
			t.Errorf("%s: table %d has no <th>", page, i)
		}
		if tb.NoScope > 0 {
			t.Errorf("%s: table %d has %d <th> without scope=col|row", page, i, tb.NoScope)
		}
	}
	if len(f.Colours) == 0 {
		t.Errorf("%s: no text found for the contrast check", page)
	}
	seen := map[string]bool{}
	for _, c := range f.Colours {
		key := c.What + c.FG + c.BG
		if seen[key] {
			continue
		}
		seen[key] = true
		ratio, err := contrast(c.FG, c.BG)
		if err != nil {
			t.Errorf("%s: %s: %v", page, c.What, err)
			continue
		}
		if ratio < 4.5 {
			t.Errorf("%s: %s %q: %s on %s has contrast %.2f:1, want at least 4.5:1", page, c.What, c.Text, c.FG, c.BG, ratio)
		}
	}
}

var rgbRE = regexp.MustCompile(`^rgba?\((\d+), (\d+), (\d+)(?:, ([0-9.]+))?\)$`)

// contrast is the WCAG 2 contrast ratio of CSS colours fg on bg, as
// getComputedStyle writes them; a translucent fg is blended over bg.
func contrast(fg, bg string) (float64, error) {
	parse := func(s string) ([3]float64, float64, error) {
		m := rgbRE.FindStringSubmatch(s)
		if m == nil {
			return [3]float64{}, 0, fmt.Errorf("colour %q is not rgb()", s)
		}
		var c [3]float64
		for i := range 3 {
			c[i], _ = strconv.ParseFloat(m[i+1], 64)
		}
		a := 1.0
		if m[4] != "" {
			a, _ = strconv.ParseFloat(m[4], 64)
		}
		return c, a, nil
	}
	f, fa, err := parse(fg)
	if err != nil {
		return 0, err
	}
	b, ba, err := parse(bg)
	if err != nil {
		return 0, err
	}
	if ba < 1 {
		return 0, fmt.Errorf("background %q is translucent", bg)
	}
	for i := range 3 {
		f[i] = f[i]*fa + b[i]*(1-fa)
	}
	lum := func(c [3]float64) float64 {
		var l [3]float64
		for i, v := range c {
			v /= 255
			if v <= 0.04045 {
				l[i] = v / 12.92
			} else {
				l[i] = math.Pow((v+0.055)/1.055, 2.4)
			}
		}
		return 0.2126*l[0] + 0.7152*l[1] + 0.0722*l[2]
	}
	l1, l2 := lum(f), lum(b)
	if l1 < l2 {
		l1, l2 = l2, l1
	}
	return (l1 + 0.05) / (l2 + 0.05), nil
}

func TestContrast(t *testing.T) {
	for _, c := range []struct {
		fg, bg string
		want   float64
	}{
		{"rgb(0, 0, 0)", "rgb(255, 255, 255)", 21},
		{"rgb(255, 255, 255)", "rgb(255, 255, 255)", 1},
		{"rgb(118, 118, 118)", "rgb(255, 255, 255)", 4.54}, // #767676, the lightest grey that passes on white
		{"rgba(0, 0, 0, 0.5)", "rgb(255, 255, 255)", 3.98},
	} {
		got, err := contrast(c.fg, c.bg)
		if err != nil || math.Abs(got-c.want) > 0.01 {
			t.Errorf("contrast(%s, %s) = %.3f, %v; want %.2f", c.fg, c.bg, got, err, c.want)
		}
	}
	if _, err := contrast("red", "rgb(1, 2, 3)"); err == nil {
		t.Error("a named colour parsed")
	}
}
