package integration

// The produce-path tap through the rtproxy binary: records produced through
// the proxy reach the routes of the same instance from the tap, and every
// output is what the fetch alone gives.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// tapShare reads tapped_records and tapped_share of route from /routes.
func tapShare(t *testing.T, p *Proxy, route string) (int64, float64) {
	t.Helper()
	resp, err := http.Get(p.AdminURL + "/routes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var rs []struct {
		Name   string  `json:"name"`
		Tapped int64   `json:"tapped_records"`
		Share  float64 `json:"tapped_share"`
	}
	if err := json.Unmarshal(b, &rs); err != nil {
		t.Fatalf("/routes: %v: %s", err, b)
	}
	for _, r := range rs {
		if r.Name == route {
			return r.Tapped, r.Share
		}
	}
	t.Fatalf("/routes has no %s: %s", route, b)
	return 0, 0
}

func TestTapThroughTheProxy(t *testing.T) {
	const source, n, rate = "tap1", 6000, 1000
	k := StartKfake(t, KfakeOpts{Topics: srTopics(source, 4)})
	rules := t.TempDir()
	rec := srStateless(t, rules, source)
	win := srWindow(t, rules, source, "20s")
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules, Env: []string{"RTPROXY_PROXY_TAP=true"}})
	for _, r := range []srRoute{rec, win} {
		srWaitOwned(t, r, srGroupTopics(t, k.Addrs, r), []*Proxy{p}, 60*time.Second)
	}
	gen := srGen(1, 0)
	load := srStartLoad(t, []string{p.Addr}, source, rate, n, gen)
	load.Wait(t, 60*time.Second)
	srFlush(t, k.Addrs, source, 4, gen(n+1).TS+3_600_000)

	src := srSource(t, k.Addrs, source)
	kept, wantWin := srKept(src), srWantWindows(src)
	col := srCollect(t, k.Addrs, rec.Sink, win.Sink)
	srWait(t, 60*time.Second, "every output", func() error {
		mr, _ := srCoverage(col.Records(rec.Sink), kept)
		mw := srWindowsMissing(col.Records(win.Sink), wantWin)
		if mr+mw > 0 {
			return fmt.Errorf("%d kept records and %d windows missing", mr, mw)
		}
		return nil
	})
	outs := srRead(t, k.Addrs, rec.Sink)
	count := srCheckStateless(t, outs, kept)
	if r := srRepeats(count); r > 0 {
		t.Errorf("%d per-record outputs repeated without any crash", r)
	}
	// In source order per source partition, as the fetch gives them.
	last := map[int32]int64{}
	for _, o := range outs {
		_, sp, off, ok := srParseRef(srHdr(o, "rtproxy-source"))
		if !ok {
			continue
		}
		if prev, seen := last[sp]; seen && off <= prev {
			t.Errorf("source partition %d: output of offset %d after offset %d", sp, off, prev)
		}
		last[sp] = off
	}
	rows := srCheckWindows(t, srRead(t, k.Addrs, win.Sink), wantWin)
	if r := srRepeats(srCountRows(rows)); r > 0 {
		t.Errorf("%d window rows repeated", r)
	}
	tapped, share := tapShare(t, p, rec.Name)
	if tapped == 0 {
		t.Errorf("no record came from the tap (share %.2f)", share)
	}
	t.Logf("stateless route: %d of %d source records from the tap (share %.2f); %d windows exact", tapped, len(src), share, len(wantWin))
}
