package pipeline

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.Cleanup()
	os.Exit(code)
}

// broker is test/kfakebroker running as its own process.
type broker struct {
	addrs []string
	cmd   *exec.Cmd
}

// startBroker starts kfake with the given topics (name → partitions) and
// extra kfakebroker flags; it is stopped when the test ends.
func startBroker(t *testing.T, topics map[string]int, extra ...string) *broker {
	t.Helper()
	var ts []string
	for n, p := range topics {
		ts = append(ts, fmt.Sprintf("%s:%d", n, p))
	}
	sort.Strings(ts)
	var args []string
	if len(ts) > 0 {
		args = append(args, "-topics", strings.Join(ts, ","))
	}
	addrs, cmd := testkit.StartKfake(t, append(args, extra...)...)
	return &broker{addrs: addrs, cmd: cmd}
}

func (b *broker) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.addrs...), kgo.ProducerLinger(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// tmpClient is closed by its caller, not at test end: a client closed
// after its brokers are gone waits out its requests.
func (b *broker) tmpClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.addrs...), kgo.ProducerLinger(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func (b *broker) produce(t *testing.T, rs ...*kgo.Record) {
	t.Helper()
	cl := b.tmpClient(t)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// consume reads topic from the start until it has want records (failing
// after timeout), then keeps reading for quiet to catch extras. opts are
// added to the reader (credentials, an isolation level).
func (b *broker) consume(t *testing.T, topic string, want int, timeout, quiet time.Duration, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl := b.tmpClient(t, append([]kgo.Opt{kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50 * time.Millisecond)}, opts...)...)
	defer cl.Close()
	var got []*kgo.Record
	deadline := time.Now().Add(timeout)
	for len(got) < want {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		fs := cl.PollFetches(ctx)
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("%s: got %d of %d records within %v", topic, len(got), want, timeout)
		}
		got = append(got, fs.Records()...)
	}
	if quiet > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		for ctx.Err() == nil {
			got = append(got, cl.PollFetches(ctx).Records()...)
		}
		cancel()
	}
	return got
}

func header(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}
