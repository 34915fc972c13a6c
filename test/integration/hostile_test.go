package integration

// A hostile client against the rtproxy binary (issue 25): compressed
// record bombs to a guarded topic, and more connections than the process
// has descriptors for. The process must stay up, within its memory, and
// go on serving everyone else.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/rtproxy/rtproxy/internal/testkit"
)

// procStatusKiB reads a field (VmHWM: peak RSS, VmRSS) of /proc/PID/status.
func procStatusKiB(t testing.TB, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc/%d/status: %v", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			if fs := strings.Fields(rest); len(fs) > 0 {
				n, _ := strconv.ParseInt(fs[0], 10, 64)
				return n
			}
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestHostileRecordBombsBounded is finding 3 of issue 25 through the
// binary: with a guard loaded, zstd Produce requests of a few kilobytes
// holding 5 and 15 million tiny records (two with batch headers that
// claim 100), four connections at once, are
// refused with MESSAGE_TOO_LARGE naming the bound, each answer is small,
// the proxy's peak RSS stays under 300 MiB (it reached 7 GB), and a
// producer beside them goes on.
func TestHostileRecordBombsBounded(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Brokers: 1, Topics: map[string]int{"gbomb": 1, "gpay.rejected": 1, "calm": 1}})
	rules := t.TempDir()
	WriteRuleFile(t, rules, "gbomb.yaml", strings.ReplaceAll(guardFile, "topic: gpay", "topic: gbomb"))
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules})
	guardInForce(t, p, "gbomb")
	bombs := []*kmsg.ProduceRequest{
		benchkit.TinyRecordsBomb("gbomb", 5_000_000, 0), benchkit.TinyRecordsBomb("gbomb", 15_000_000, 0),
		benchkit.TinyRecordsBomb("gbomb", 5_000_000, 100), benchkit.TinyRecordsBomb("gbomb", 15_000_000, 100), // lying headers
	}
	for i, b := range bombs {
		t.Logf("bomb %d: %d bytes on the wire", i, len(b.Topics[0].Partitions[0].Records))
	}
	before := procStatusKiB(t, p.PID(), "VmHWM")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, bomb := range bombs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vs := kversion.Stable()
			vs.SetMaxKeyVersion(int16(kmsg.Produce), 12) // topics by name
			cl := NewClient(t, []string{p.Addr}, kgo.MaxVersions(vs))
			defer cl.Close()
			for round := range 3 {
				resp, err := bomb.RequestWith(ctx, cl)
				if err != nil {
					t.Errorf("bomb %d round %d: %v", i, round, err)
					return
				}
				pp := resp.Topics[0].Partitions[0]
				if pp.ErrorCode != kerr.MessageTooLarge.Code || pp.ErrorMessage == nil || !strings.Contains(*pp.ErrorMessage, "proxy.max_") {
					t.Errorf("bomb %d: %v %v", i, kerr.ErrorForCode(pp.ErrorCode), pp.ErrorMessage)
				}
				if n := len(resp.AppendTo(nil)); n > 4096 {
					t.Errorf("bomb %d: a %d-byte response", i, n)
				}
			}
		}()
	}
	// A producer beside the bombs.
	cl := NewClient(t, []string{p.Addr}, kgo.ProducerLinger(0))
	for i := range 20 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "calm", Value: []byte(fmt.Sprint(i))}).FirstErr(); err != nil {
			t.Errorf("produce beside the bombs: %v", err)
		}
	}
	wg.Wait()
	peak := procStatusKiB(t, p.PID(), "VmHWM")
	t.Logf("proxy peak RSS %d MiB before the bombs, %d MiB after (4 connections x 3 rounds)", before>>10, peak>>10)
	if peak > 300<<10 {
		t.Errorf("peak RSS %d MiB, want under 300 MiB", peak>>10)
	}
	if !p.Running() {
		t.Fatal("the proxy died")
	}
	Eventually(t, 10*time.Second, "the refusals counted", func() error {
		body := adminMetrics(t, p)
		if !strings.Contains(body, `rtproxy_proxy_decode_limited_total{bound="records",path="guard"} 6`) ||
			!strings.Contains(body, `rtproxy_proxy_decode_limited_total{bound="bytes",path="guard"} 6`) {
			return fmt.Errorf("no decode_limited_total of 6 and 6 in\n%s", grepLines(body, "decode_limited"))
		}
		return nil
	})
}

func adminMetrics(t testing.TB, p *Proxy) string {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(p.AdminURL + "/metrics")
	if err != nil {
		t.Fatalf("the admin listener does not answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func metricNumber(body, series string) float64 {
	for _, l := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// TestHostileConnectionsUnderFdLimit: at an open-file limit of 1200, a
// client opening 1000 idle connections must meet max_connections, not
// EMFILE: the cap in force fits the limit (an idle connection holds one
// descriptor, its upstream is dialed at its first request), the refused
// ones are counted, nothing is logged per failed accept, and once the
// idle connections go, clients are served again.
func TestHostileConnectionsUnderFdLimit(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Brokers: 1, Topics: map[string]int{"fd": 1}})
	wrapper := filepath.Join(t.TempDir(), "rtproxy-nofile")
	script := "#!/bin/sh\nulimit -n 1200 || exit 1\nexec " + testkit.RtproxyBinary(t) + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, Binary: wrapper})
	conns := make([]net.Conn, 0, 1000)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 1000 {
		c, err := net.DialTimeout("tcp", p.Addr, 2*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	var body string
	Eventually(t, 20*time.Second, "every connection accepted or refused", func() error {
		body = adminMetrics(t, p)
		open := metricNumber(body, "rtproxy_proxy_connections_open")
		refused := metricNumber(body, "rtproxy_proxy_connections_refused_total")
		if open+refused < 1000 {
			return fmt.Errorf("%v open, %v refused", open, refused)
		}
		return nil
	})
	open := metricNumber(body, "rtproxy_proxy_connections_open")
	refused := metricNumber(body, "rtproxy_proxy_connections_refused_total")
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.PID()))
	t.Logf("1000 connections at RLIMIT_NOFILE 1200: %v open, %v refused, %d descriptors in use", open, refused, len(fds))
	if refused == 0 || open > 600 {
		t.Errorf("%v open and %v refused: max_connections in force does not fit 1200 descriptors", open, refused)
	}
	if len(fds) > int(open)+150 {
		t.Errorf("%d descriptors for %v idle connections: an idle connection must hold one", len(fds), open)
	}
	if v := metricNumber(body, `rtproxy_proxy_accept_errors_total{reason="out_of_descriptors"}`); v != 0 {
		t.Errorf("%v accepts failed out of descriptors", v)
	}
	logs := p.Logs()
	if n := strings.Count(logs, "accept failed"); n > 1 {
		t.Errorf("%d 'accept failed' lines", n)
	}
	if !strings.Contains(logs, "max_connections lowered to fit the open-file limit") {
		t.Errorf("no log line saying max_connections was lowered:\n%s", logs)
	}
	// The idle ones go; a real client is served.
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	Eventually(t, 20*time.Second, "the idle connections closed", func() error {
		if v := metricNumber(adminMetrics(t, p), "rtproxy_proxy_connections_open"); v > 0 {
			return fmt.Errorf("%v still open", v)
		}
		return nil
	})
	Produce(t, []string{p.Addr}, "fd", "after", 10)
	if got := Consume(t, []string{p.Addr}, "fd", 10, 20*time.Second); len(got) != 10 {
		t.Fatalf("consumed %d of 10", len(got))
	}
}
