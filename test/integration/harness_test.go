// Package integration holds the tests that start real processes — kfake
// brokers (test/kfakebroker), the built rtproxy binary — and drive them with
// real client libraries written by other people.
//
// This file is the shared harness: the kfake and rtproxy processes from
// internal/testkit (built once per test run, started and restarted on fixed
// ports), and the franz-go helpers tests use to assert on what actually
// reached the brokers.
//
// Set RTPROXY_IT_DIRECT=1 to run the client cases straight against kfake
// (no proxy) while the proxy is being developed; the proxy-address checks
// are then skipped with a log line.
package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// The processes (kfake, rtproxy), their binaries and the ports they listen
// on come from internal/testkit, under the names the tests here use.
type (
	KfakeOpts = testkit.KfakeOpts
	Kfake     = testkit.Kfake
	ProxyOpts = testkit.ProxyOpts
	Proxy     = testkit.Proxy
)

// ModuleRoot is the folder holding go.mod, above the working directory.
var ModuleRoot = testkit.ModuleRoot

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.Cleanup()
	os.Exit(code)
}

// StartKfake starts kfake in its own process on fixed ports and waits for
// its ready line. The process is killed when the test ends.
func StartKfake(t testing.TB, o KfakeOpts) *Kfake {
	t.Helper()
	testkit.Prebuild() // the proxy builds meanwhile
	return testkit.StartKfakeWith(t, o)
}

// StartProxy starts the built rtproxy binary in front of o.Upstream and
// waits until /readyz answers 200 (20s, failing with the proxy's logs).
func StartProxy(t testing.TB, o ProxyOpts) *Proxy {
	t.Helper()
	testkit.Prebuild()
	return testkit.StartProxy(t, o)
}

// WriteRuleFile writes a rule file atomically (temp file + rename, as an
// editor or a ConfigMap update would) into dir and returns its path.
func WriteRuleFile(t testing.TB, dir, name, yaml string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	tmp, err := os.CreateTemp(dir, ".tmp-"+name+"-")
	if err != nil {
		t.Fatalf("write rule %s: %v", name, err)
	}
	if _, err := tmp.WriteString(yaml); err != nil {
		t.Fatalf("write rule %s: %v", name, err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatalf("write rule %s: %v", name, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatalf("write rule %s: %v", name, err)
	}
	return path
}

// Eventually retries cond every 50ms until it returns nil or timeout
// passes, then fails with its last error.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// --- stack: kfake + proxy --------------------------------------------------

// Stack is one kfake cluster with an rtproxy in front of it.
type Stack struct {
	Kfake     *Kfake
	Proxy     *Proxy // nil in direct mode (RTPROXY_IT_DIRECT=1)
	Bootstrap []string
}

// DirectMode reports whether client cases should skip the proxy.
func DirectMode() bool { return os.Getenv("RTPROXY_IT_DIRECT") == "1" }

// StartStack starts kfake and, unless in direct mode, the proxy in front.
func StartStack(t testing.TB, ko KfakeOpts, po ProxyOpts) *Stack {
	t.Helper()
	s := &Stack{Kfake: StartKfake(t, ko)}
	if DirectMode() {
		t.Logf("RTPROXY_IT_DIRECT=1: clients talk to kfake directly")
		s.Bootstrap = s.Kfake.Addrs
		return s
	}
	po.Upstream = s.Kfake.Addrs
	s.Proxy = StartProxy(t, po)
	s.Bootstrap = []string{s.Proxy.Addr}
	return s
}

// AssertOnlyProxyAddrs checks what a client saw as broker addresses.
func (s *Stack) AssertOnlyProxyAddrs(t testing.TB, seen []string) {
	t.Helper()
	if s.Proxy == nil {
		if len(seen) == 0 {
			t.Errorf("client reported no broker addresses")
		}
		t.Logf("direct mode: not checking addresses %v", seen)
		return
	}
	AssertOnlyProxyAddrs(t, seen, s.Proxy)
}

// AssertProxyCarried fails unless the proxy's rtproxy_proxy_requests_total
// counted at least one request of each API key: proof that the client's
// traffic of that kind went through the proxy rather than around it.
func (s *Stack) AssertProxyCarried(t testing.TB, keys ...kmsg.Key) {
	t.Helper()
	if s.Proxy == nil {
		return
	}
	text := s.Proxy.Metrics(t)
	for _, k := range keys {
		name := kmsg.NameForKey(int16(k))
		prefix := `rtproxy_proxy_requests_total{api="` + name + `"} `
		var v float64
		for _, line := range strings.Split(text, "\n") {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				v, _ = strconv.ParseFloat(strings.TrimSpace(rest), 64)
			}
		}
		if v < 1 {
			t.Errorf("proxy counted %v %s requests; the client's %s traffic did not go through it", v, name, name)
		}
	}
}

// AssertOnlyProxyAddrs fails unless seen is non-empty and every address is
// the proxy's bootstrap or one of its per-broker listeners on 127.0.0.1.
func AssertOnlyProxyAddrs(t testing.TB, seen []string, proxy *Proxy) {
	t.Helper()
	if len(seen) == 0 {
		t.Errorf("client reported no broker addresses; cannot prove it saw only the proxy")
		return
	}
	for _, a := range seen {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			t.Errorf("address %q: %v", a, err)
			continue
		}
		n, _ := strconv.Atoi(port)
		inRange := n >= proxy.BrokerPortFirst && n < proxy.BrokerPortFirst+testkit.BrokerPortCount
		if host != "127.0.0.1" || !(inRange || a == proxy.Addr) {
			t.Errorf("client saw %q, which is not a proxy address (bootstrap %s, broker ports %d-%d)",
				a, proxy.Addr, proxy.BrokerPortFirst, proxy.BrokerPortFirst+testkit.BrokerPortCount-1)
		}
	}
}

// --- tools -----------------------------------------------------------------

// DebianPython is the interpreter that sees Debian's python3-kafka and
// python3-confluent-kafka (the PATH python3 is a pyenv shim).
const DebianPython = "/usr/bin/python3"

// RequireTool skips the test when a client tool or library is missing, or
// fails it when CI=true, where every client must be present. Names:
// "python3-kafka", "python3-confluent-kafka", "kafkajs", or any executable.
func RequireTool(t testing.TB, name string) {
	t.Helper()
	var err error
	switch name {
	case "python3-kafka":
		err = exec.Command(DebianPython, "-c", "import kafka").Run()
	case "python3-confluent-kafka":
		err = exec.Command(DebianPython, "-c", "import confluent_kafka").Run()
	case "kafkajs":
		if _, err = exec.LookPath("node"); err == nil {
			_, err = os.Stat(filepath.Join(ModuleRoot(t), "test", "integration", "node_modules", "kafkajs", "package.json"))
		}
	default:
		_, err = exec.LookPath(name)
	}
	if err == nil {
		return
	}
	msg := fmt.Sprintf("client %q is missing (%v); install it with `make deps`", name, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " — CI=true, so a missing client is a failure")
	}
	t.Skip(msg)
}

// --- franz-go helpers ------------------------------------------------------

// NewClient returns a franz-go client closed at test end, with linger 0.
func NewClient(t testing.TB, seeds []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	all := append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.ProducerLinger(0)}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// MakeRecords makes n records with keys "k-<i>" and values "<prefix>-<i>".
func MakeRecords(topic, prefix string, n int) []*kgo.Record {
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k-%d", i), Value: fmt.Appendf(nil, "%s-%d", prefix, i)}
	}
	return rs
}

// Produce writes n records (see MakeRecords) synchronously and returns
// their values in order.
func Produce(t testing.TB, seeds []string, topic, prefix string, n int) []string {
	t.Helper()
	// Uncompressed, so that clients without snappy/lz4 libraries can read them.
	cl := NewClient(t, seeds, kgo.ProducerBatchCompression(kgo.NoCompression()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs := MakeRecords(topic, prefix, n)
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce %d records to %s: %v", n, topic, err)
	}
	return Values(rs)
}

// Consume reads topic from the start (all partitions, no group) until it has
// want records, failing after timeout with what it got.
func Consume(t testing.TB, seeds []string, topic string, want int, timeout time.Duration, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl := NewClient(t, seeds, append([]kgo.Opt{kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	return PollN(t, cl, want, timeout)
}

// PollN polls cl until it has want records or timeout passes (failing).
func PollN(t testing.TB, cl *kgo.Client, want int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []*kgo.Record
	for len(got) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records within %v", len(got), want, timeout)
		}
		fs.EachError(func(tp string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Logf("fetch %s[%d]: %v", tp, p, err)
			}
		})
		got = append(got, fs.Records()...)
	}
	return got
}

// ConsumeQuiet reads topic from the start until no record arrives for quiet
// (after at least min records or the overall timeout), returning everything.
// Use it to prove that records are absent (aborted transactions).
func ConsumeQuiet(t testing.TB, seeds []string, topic string, min int, quiet, timeout time.Duration, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl := NewClient(t, seeds, append([]kgo.Opt{kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	deadline := time.Now().Add(timeout)
	var got []*kgo.Record
	for time.Now().Before(deadline) {
		wait := quiet
		if len(got) < min {
			wait = time.Until(deadline)
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r); n++ })
		if n == 0 && len(got) >= min {
			return got
		}
	}
	if len(got) < min {
		t.Fatalf("consumed %d records, want at least %d within %v", len(got), min, timeout)
	}
	return got
}

// Values returns the records' values as strings, in order.
func Values(rs []*kgo.Record) []string {
	vs := make([]string, len(rs))
	for i, r := range rs {
		vs[i] = string(r.Value)
	}
	return vs
}

// AssertSameSet fails unless got and want hold the same strings with the same
// multiplicity (order ignored: records spread over partitions).
func AssertSameSet(t testing.TB, what string, got, want []string) {
	t.Helper()
	g := append([]string(nil), got...)
	w := append([]string(nil), want...)
	sort.Strings(g)
	sort.Strings(w)
	if len(g) != len(w) {
		t.Errorf("%s: got %d records, want %d\n got: %s\nwant: %s", what, len(g), len(w), clip(g), clip(w))
		return
	}
	for i := range g {
		if g[i] != w[i] {
			t.Errorf("%s: record sets differ at sorted index %d: got %q, want %q\n got: %s\nwant: %s", what, i, g[i], w[i], clip(g), clip(w))
			return
		}
	}
}

func clip(s []string) string {
	if len(s) > 12 {
		return fmt.Sprintf("%q … (%d more)", s[:12], len(s)-12)
	}
	return fmt.Sprintf("%q", s)
}

// MetadataBrokers asks for cluster metadata through cl and returns the
// broker addresses the response carried, as host:port.
func MetadataBrokers(t testing.TB, cl *kgo.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	var addrs []string
	for _, b := range resp.Brokers {
		addrs = append(addrs, net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))))
	}
	return addrs
}

// CoordinatorAddrs asks FindCoordinator for a group key and returns the
// address it names.
func CoordinatorAddrs(t testing.TB, cl *kgo.Client, group string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorKey = group
	req.CoordinatorKeys = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("find coordinator: %v", err)
	}
	var addrs []string
	if len(resp.Coordinators) > 0 {
		for _, c := range resp.Coordinators {
			addrs = append(addrs, net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))))
		}
	} else {
		addrs = append(addrs, net.JoinHostPort(resp.Host, strconv.Itoa(int(resp.Port))))
	}
	return addrs
}

// UniqueTopic returns a topic name unique to the test.
func UniqueTopic(t testing.TB, base string) string {
	return fmt.Sprintf("%s-%d", base, rand.IntN(1_000_000))
}
