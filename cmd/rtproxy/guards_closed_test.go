package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// syncBuf is a bytes.Buffer the child's output goroutines write to.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestBinaryGuardInvalidAtStartFailsClosed is finding 13 through the
// binary with a real client: a guard file that is invalid when the proxy
// starts keeps the proxy not ready and refuses every record produced to
// its topic, with an error saying so, until the file is fixed; other
// topics flow. Then the real guard is in force.
func TestBinaryGuardInvalidAtStartFailsClosed(t *testing.T) {
	rulesDir := t.TempDir()
	bad := "guard: pay-shape\ntopic: payments\nchecks:\n  - check: value.amount >\n    message: amount must be positive\n"
	good := strings.Replace(bad, "value.amount >\n", "value.amount > 0\n", 1)
	gfile := filepath.Join(rulesDir, "pay-shape.yaml")
	if err := os.WriteFile(gfile, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	// Started by hand: testkit.StartProxy waits for /readyz 200, which an
	// invalid guard must not give.
	ports := testkit.FreePorts(t, 2)
	listen, admin := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	cmd := exec.Command(rtproxyBinary(t), "run", "--listen", listen, "--advertise-host", "127.0.0.1",
		"--broker-ports", strconv.Itoa(testkit.FreePortBlock(t, testkit.BrokerPortCount)),
		"--admin-listen", admin[len("http://"):], "--rules-dir", rulesDir, "--state-dir", filepath.Join(t.TempDir(), "state"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	logs := &syncBuf{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = testkit.ChildAttr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("rtproxy logs:\n%s", logs.String())
		}
	})
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, d)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("/healthz 200", 30*time.Second, func() bool { c, _, _ := httpGet(admin + "/healthz"); return c == 200 })
	var code int
	var body string
	waitFor("/readyz names the guard", 20*time.Second, func() bool {
		code, body, _ = httpGet(admin + "/readyz")
		if code == 200 {
			t.Fatalf("/readyz is 200 while guard pay-shape does not load: %q", body)
		}
		return strings.Contains(body, "guard pay-shape does not load")
	})
	if code != 503 {
		t.Fatalf("/readyz %d %q, want 503", code, body)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(listen), kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation(), kgo.RecordRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(topic string, amount int) error {
		return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf(`{"amount":%d}`, amount))}).FirstErr()
	}
	// Other topics flow (the topic is created by the first produce).
	waitFor("a produce to another topic", 20*time.Second, func() bool { return produce("orders", -5) == nil })
	for _, amount := range []int{-5, 5} {
		err := produce("payments", amount)
		if !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("amount %d to payments under a guard that does not load: %v, want INVALID_RECORD", amount, err)
		}
	}
	waitMetric(t, admin, `rtproxy_guard_rejected_records_total{check="guard_invalid",guard="pay-shape"} 2`)
	// The refusal carries the guard's message (franz-go reports only the
	// code; kafka-python and librdkafka show it): it is on the guard
	// dead-letter path and in the response, tested in protocol/ and rules/.
	if !strings.Contains(logs.String(), "guard fails closed") {
		t.Error("the closed guard is not logged")
	}

	// Fixed: ready, and the guard's own checks decide.
	if err := os.WriteFile(gfile, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("/readyz 200 after the fix", 20*time.Second, func() bool { c, _, _ := httpGet(admin + "/readyz"); return c == 200 })
	if err := produce("payments", 5); err != nil {
		t.Fatalf("a good record after the fix: %v", err)
	}
	if err := produce("payments", -5); !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("a bad record after the fix: %v", err)
	}
}
