package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/internal/testkit"
)

const testVersion = "v0.0.0-cmdtest"

// rtproxyBinary builds this command once, version-stamped the way the
// Makefile does.
func rtproxyBinary(t *testing.T) string {
	t.Helper()
	return testkit.RtproxyBinary(t, "-trimpath", "-ldflags", "-X main.version="+testVersion)
}

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.Cleanup()
	os.Exit(code)
}

// runBinary runs the binary to completion with env added to a clean
// environment (no inherited RTPROXY_*).
func runBinary(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(rtproxyBinary(t), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	cmd.Dir = t.TempDir()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.SysProcAttr = testkit.ChildAttr()
	err := cmd.Run()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("run %v: %v", args, err)
		}
	}
	return cmd.ProcessState.ExitCode(), o.String(), e.String()
}

func TestBinaryVersionAndUsage(t *testing.T) {
	code, out, _ := runBinary(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "rtproxy "+testVersion+" (go") {
		t.Fatalf("version: exit %d, %q", code, out)
	}
	code, _, errOut := runBinary(t, nil)
	if code != 2 || !strings.Contains(errOut, "rtproxy run [--config FILE]") {
		t.Fatalf("no args: exit %d, %q", code, errOut)
	}
	code, _, errOut = runBinary(t, nil, "run", "--help")
	if code != 0 || !strings.Contains(errOut, "--upstream") || !strings.Contains(errOut, "--broker-ports") || strings.Contains(errOut, "print-config") {
		t.Fatalf("run --help: exit %d, %q", code, errOut)
	}
	code, _, errOut = runBinary(t, nil, "frobnicate")
	if code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Fatalf("unknown command: exit %d, %q", code, errOut)
	}
}

func TestBinaryCheck(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	code, out, errOut := runBinary(t, nil, "check", missing)
	if code != 1 || !strings.Contains(out+errOut, missing) || !strings.Contains(out+errOut, "no such file") {
		t.Fatalf("check missing file: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = runBinary(t, nil, "check")
	if code != 2 || !strings.Contains(errOut, "usage: rtproxy check [--config FILE] [--tables-dir DIR] PATH...") {
		t.Fatalf("check without paths: exit %d, %q", code, errOut)
	}
	// A table outside the rules directory passes only with --tables-dir.
	rulesDir, tablesDir := t.TempDir(), t.TempDir()
	table := filepath.Join(tablesDir, "m.jsonl")
	os.WriteFile(table, []byte(`{"id":"a"}`+"\n"), 0o644)
	rule := filepath.Join(rulesDir, "r.yaml")
	os.WriteFile(rule, []byte("route: r\nsource: { topic: in }\nsink: { topic: out }\ntables:\n  m: { file: "+table+", key: id }\n"), 0o644)
	if code, out, _ := runBinary(t, nil, "check", rulesDir); code != 1 || !strings.Contains(out, "is outside the rules directory") {
		t.Errorf("a table outside the rules directory: exit %d, %q", code, out)
	}
	if code, out, errOut := runBinary(t, nil, "check", "--tables-dir", tablesDir, rulesDir); code != 0 {
		t.Errorf("with --tables-dir: exit %d, %q %q", code, out, errOut)
	}
	if code, out, errOut := runBinary(t, []string{"RTPROXY_TABLES_DIR=" + tablesDir}, "check", rulesDir); code != 0 {
		t.Errorf("with RTPROXY_TABLES_DIR: exit %d, %q %q", code, out, errOut)
	}
}

func TestBinaryConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rtproxy.yaml")
	os.WriteFile(file, []byte("listen: 127.0.0.1:1001\nrules_dir: /file/rules\nstate_dir: /file/state\nlog_level: warn\nupstream: [file-broker:9092]\n"+
		"sasl: {mechanism: PLAIN, username: me, password: hunter2}\n"), 0o644)
	cases := []struct {
		name  string
		env   []string
		args  []string
		check func(c *config.Config) bool
	}{
		{"file", nil, []string{"--config", file}, func(c *config.Config) bool {
			return c.Listen == "127.0.0.1:1001" && c.RulesDir == "/file/rules" && c.LogLevel == "warn" && c.Upstream[0] == "file-broker:9092"
		}},
		{"config file from env", []string{"RTPROXY_CONFIG=" + file}, nil, func(c *config.Config) bool { return c.Listen == "127.0.0.1:1001" }},
		{"env over file", []string{"RTPROXY_LISTEN=127.0.0.1:2002", "RTPROXY_UPSTREAM=e1:1,e2:2"}, []string{"--config", file}, func(c *config.Config) bool {
			return c.Listen == "127.0.0.1:2002" && c.RulesDir == "/file/rules" && strings.Join(c.Upstream, ",") == "e1:1,e2:2"
		}},
		{"flag over env over file", []string{"RTPROXY_LISTEN=127.0.0.1:2002", "RTPROXY_RULES_DIR=/env/rules"},
			[]string{"--config", file, "--listen", "127.0.0.1:3003", "--upstream", "f:1", "--log-level", "debug"}, func(c *config.Config) bool {
				return c.Listen == "127.0.0.1:3003" && c.RulesDir == "/env/rules" && c.StateDir == "/file/state" && c.LogLevel == "debug" &&
					strings.Join(c.Upstream, ",") == "f:1"
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runBinary(t, tc.env, append([]string{"run", "--print-config"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			c := config.Default()
			if err := c.Parse("printed", []byte(out)); err != nil {
				t.Fatalf("printed config does not parse: %v\n%s", err, out)
			}
			if !tc.check(c) {
				t.Fatalf("wrong effective config:\n%s", out)
			}
			if strings.Contains(out, "hunter2") || !strings.Contains(out, "REDACTED") {
				t.Fatalf("password not redacted:\n%s", out)
			}
		})
	}
}

func TestBinaryBadConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bad.yaml")
	os.WriteFile(file, []byte("listen: 127.0.0.1:1001\nlisten_address: x\n"), 0o644)
	code, _, errOut := runBinary(t, nil, "run", "--config", file)
	if code != 2 || !strings.Contains(errOut, file+`:2:1: unknown key "listen_address"`) {
		t.Fatalf("unknown key: exit %d, %q", code, errOut)
	}
	code, _, errOut = runBinary(t, []string{"RTPROXY_BROKER_PORTS=lots"}, "run")
	if code != 2 || !strings.Contains(errOut, `RTPROXY_BROKER_PORTS: "lots" is not an integer`) {
		t.Fatalf("bad env: exit %d, %q", code, errOut)
	}
	code, _, errOut = runBinary(t, nil, "run", "--admin-listen", "127.0.0.1:9100")
	if code != 2 || !strings.Contains(errOut, "admin_listen: port 9100 is inside the broker port range 9093-9192") {
		t.Fatalf("conflict: exit %d, %q", code, errOut)
	}
}

func httpGet(url string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// proc is a running rtproxy binary, under the short names this package's
// tests use.
type proc struct {
	*testkit.Proxy
	listen      string
	admin       string // http://host:port
	brokerFirst int
	stateDir    string
}

// startRun starts `rtproxy run` on free ports with the given rules directory
// (embedded mode unless extra names an upstream) and waits for /readyz 200.
// extra holds more flags, then any RTPROXY_NAME=value environment entries;
// no other environment reaches the proxy but PATH.
func startRun(t *testing.T, rulesDir string, extra ...string) *proc {
	t.Helper()
	var env []string
	for len(extra) > 0 && strings.HasPrefix(extra[len(extra)-1], "RTPROXY_") {
		// Trailing NAME=value arguments are environment, not flags.
		env = append(env, extra[len(extra)-1])
		extra = extra[:len(extra)-1]
	}
	p := testkit.StartProxy(t, testkit.ProxyOpts{
		RulesDir:  rulesDir,
		StateDir:  filepath.Join(t.TempDir(), "state"),
		ExtraArgs: extra,
		Env:       env,
		CleanEnv:  true,
		Binary:    rtproxyBinary(t),
	})
	return &proc{Proxy: p, listen: p.Addr, admin: p.AdminURL, brokerFirst: p.BrokerPortFirst, stateDir: p.Opts.StateDir}
}

// stop sends SIGTERM and asserts a clean exit 0 within 15s.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	start := time.Now()
	code, exited := p.Terminate(15 * time.Second)
	if !exited {
		t.Fatal("still running 15s after SIGTERM")
	}
	if code != 0 {
		t.Fatalf("exit code %d after SIGTERM (want 0)", code)
	}
	l := p.Logs()
	for _, want := range []string{`msg="shutting down" signal=terminated`, "rtproxy stopped cleanly"} {
		if !strings.Contains(l, want) {
			t.Errorf("logs lack %q", want)
		}
	}
	t.Logf("stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}

// TestBinaryRunEmbedded runs `rtproxy run` with no upstream (the embedded
// development cluster) on free ports, produces and consumes through it with
// franz-go, reads the admin endpoints, and stops it with SIGTERM.
func TestBinaryRunEmbedded(t *testing.T) {
	p := startRun(t, filepath.Join(t.TempDir(), "rules"), "RTPROXY_LISTN=127.0.0.1:1")
	admin, listen, brokerFirst := p.admin, p.listen, p.brokerFirst
	if code, body, _ := httpGet(admin + "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body, _ := httpGet(admin + "/routes"); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Fatalf("/routes with no rule files: %d %q", code, body)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(listen), kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeTopics("cmd-e2e"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	// Every broker address a client sees is the proxy's.
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(meta.Brokers) != 3 {
		t.Fatalf("metadata shows %d brokers, want 3", len(meta.Brokers))
	}
	for _, b := range meta.Brokers {
		if b.Host != "127.0.0.1" || b.Port < int32(brokerFirst) || b.Port >= int32(brokerFirst+100) {
			t.Fatalf("broker %d advertised as %s:%d, outside the proxy range %d-%d", b.NodeID, b.Host, b.Port, brokerFirst, brokerFirst+99)
		}
	}

	const n = 50
	for i := range n {
		r := &kgo.Record{Topic: "cmd-e2e", Key: []byte(strconv.Itoa(i % 5)), Value: []byte(fmt.Sprintf("value-%03d", i))}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce %d through the proxy: %v", i, err)
		}
	}
	seen := map[string]bool{}
	for len(seen) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records before timeout", len(seen), n)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Logf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true })
	}
	for i := range n {
		if !seen[fmt.Sprintf("value-%03d", i)] {
			t.Fatalf("value-%03d never consumed", i)
		}
	}

	_, metrics, err := httpGet(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`rtproxy_proxy_requests_total{api="Produce"}`, `rtproxy_proxy_requests_total{api="Fetch"}`, "rtproxy_build_info{", "go_goroutines"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	if !strings.Contains(p.Logs(), `msg="environment variable is not an rtproxy setting; ignored (see docs/OPERATIONS.md)" name=RTPROXY_LISTN`) {
		t.Error("a misspelt RTPROXY_ variable was not reported")
	}
	if !strings.Contains(p.Logs(), "EMBEDDED DEVELOPMENT BROKER") {
		t.Error("no loud warning about the embedded development broker")
	}
	cl.Close()
	p.stop(t)
}

// TestBinaryRunRoute runs a route from a rule file through the whole binary:
// the watcher loads it when it appears, the pipeline filters records produced through the
// proxy into the sink, /routes reports it, and SIGHUP is a reload (not the
// default "terminate").
func TestBinaryRunRoute(t *testing.T) {
	rulesDir := t.TempDir()
	p := startRun(t, rulesDir)

	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.listen), kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeTopics("orders.big"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, topic := range []string{"orders", "orders.big"} {
		req := kmsg.NewPtrCreateTopicsRequest()
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 3, 1
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		if c := resp.Topics[0].ErrorCode; c != 0 && c != 36 /* TOPIC_ALREADY_EXISTS */ {
			t.Fatalf("create %s: error code %d", topic, c)
		}
	}

	// The rule file arrives while the proxy runs: the watcher picks it up.
	rule := "route: big-orders\nsource: { topic: orders, format: json, start: earliest }\nsink: { topic: orders.big }\nsteps:\n  - filter: value.amount > 100\n"
	if err := os.WriteFile(filepath.Join(rulesDir, "big-orders.yaml"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}

	want := map[int]bool{} // ids the filter admits
	for i := range 40 {
		amount := i * 5 // 0..195: amounts above 100 are i >= 21
		if amount > 100 {
			want[i] = true
		}
		v := fmt.Sprintf(`{"id":%d,"amount":%d}`, i, amount)
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte(strconv.Itoa(i)), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	got := map[int]bool{}
	for len(got) < len(want) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("sink holds %d of %d expected records after 45s", len(got), len(want))
		}
		fs.EachRecord(func(r *kgo.Record) {
			var v struct{ ID, Amount int }
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatalf("sink record %q: %v", r.Value, err)
			}
			if !want[v.ID] || v.Amount != v.ID*5 {
				t.Errorf("sink got %s, which the filter should have dropped", r.Value)
			}
			got[v.ID] = true
		})
	}
	code, body, err := httpGet(p.admin + "/routes")
	if err != nil || code != 200 {
		t.Fatalf("/routes: %d %v", code, err)
	}
	var status []struct {
		Name, Source, Sink, State string
	}
	if err := json.Unmarshal([]byte(body), &status); err != nil || len(status) != 1 ||
		status[0].Name != "big-orders" || status[0].Source != "orders" || status[0].Sink != "orders.big" || status[0].State != "running" {
		t.Fatalf("/routes: %v %s", err, body)
	}
	// The out counter moves on the sink's acknowledgement, which can reach
	// the pipeline a moment after our consumer saw the records.
	for _, want := range []string{"rtproxy_rules_routes 1", `rtproxy_pipeline_records_out_total{route="big-orders"} 19`} {
		waitMetric(t, p.admin, want)
	}

	// Every series the binary exports, from every part, passes promlint.
	_, metrics, err := httpGet(p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.New(strings.NewReader(metrics)).Lint()
	if err != nil {
		t.Fatalf("promlint cannot parse /metrics: %v", err)
	}
	for _, pr := range problems {
		t.Errorf("promlint: %s: %s", pr.Metric, pr.Text)
	}

	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(p.Logs(), "rules: reload requested") {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not reach the rules watcher")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _, err := httpGet(p.admin + "/healthz"); err != nil || code != 200 {
		t.Fatalf("after SIGHUP /healthz: %d %v (SIGHUP must not stop the process)", code, err)
	}
	cl.Close()
	p.stop(t)
}

// waitMetric polls /metrics until it holds the line want (20s: the value
// may wait on a sink acknowledgement from the broker on a loaded machine).
func waitMetric(t *testing.T, admin, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, metrics, err := httpGet(admin + "/metrics")
		if err == nil && strings.Contains(metrics, want+"\n") {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("/metrics lacks %q after 20s", want)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBinaryPortInUse: a port already taken is a clear error and exit 1,
// whether it is the admin port or the Kafka bootstrap port.
func TestBinaryPortInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	dir := t.TempDir()
	base := []string{"run", "--rules-dir", filepath.Join(dir, "rules"), "--state-dir", filepath.Join(dir, "state"),
		"--broker-ports", strconv.Itoa(testkit.FreePortBlock(t, testkit.BrokerPortCount))}

	code, _, errOut := runBinary(t, nil, append(base, "--admin-listen", addr, "--listen", "127.0.0.1:"+strconv.Itoa(testkit.FreePorts(t, 1)[0]))...)
	if code != 1 || !strings.Contains(errOut, "admin_listen "+addr) || !strings.Contains(errOut, "address already in use") {
		t.Fatalf("admin port in use: exit %d\n%s", code, errOut)
	}
	code, _, errOut = runBinary(t, nil, append(base, "--listen", addr, "--admin-listen", "127.0.0.1:"+strconv.Itoa(testkit.FreePorts(t, 1)[0]))...)
	if code != 1 || !strings.Contains(errOut, addr) || !strings.Contains(errOut, "address already in use") {
		t.Fatalf("listen port in use: exit %d\n%s", code, errOut)
	}
	if !strings.Contains(errOut, "embedded broker closed") {
		t.Fatalf("the embedded broker started before the failure was not closed:\n%s", errOut)
	}
}
