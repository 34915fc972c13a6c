package protocol

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// testView is a view written in Go: it drops records whose JSON status is
// "test", masks the card but its last 4 characters, and fails records
// that are not JSON.
type testView struct {
	name, topic string
	clients     []string // client ids it applies to; none: every client
}

func (v *testView) Name() string  { return v.name }
func (v *testView) Topic() string { return v.topic }
func (v *testView) applies(c ViewClient) bool {
	return len(v.clients) == 0 || slices.Contains(v.clients, c.ClientID) || slices.Contains(v.clients, "principal:"+c.Principal) ||
		slices.Contains(v.clients, "tls:"+c.TLSSubject)
}

func (v *testView) Apply(r *ViewRecord) (bool, error) {
	var m map[string]any
	if err := json.Unmarshal(r.Value, &m); err != nil {
		return false, errors.New("value is not JSON")
	}
	if m["status"] == "test" {
		return false, nil
	}
	if c, ok := m["card"].(string); ok && len(c) >= 4 {
		m["card"] = "****" + c[len(c)-4:]
	}
	r.Value, _ = json.Marshal(m)
	r.Headers = append(slices.Clone(r.Headers), kmsg.Header{Key: "view", Value: []byte(v.name)})
	return true, nil
}

type testViews []*testView

func (vs testViews) Lookup(name string, c ViewClient) View {
	for _, v := range vs {
		if v.name == name && v.applies(c) {
			return v
		}
	}
	return nil
}

func (vs testViews) Virtual(c ViewClient) map[string]string {
	out := map[string]string{}
	for _, v := range vs {
		if v.name != v.topic && v.applies(c) {
			out[v.name] = v.topic
		}
	}
	return out
}

// viewInput is record i of the test topic: every 3rd has status "test",
// every 10th from 7 on is not JSON.
func viewInput(i int) string {
	if i%10 == 7 {
		return fmt.Sprintf("not json %d", i)
	}
	status := "ok"
	if i%3 == 0 {
		status = "test"
	}
	return fmt.Sprintf(`{"n":%d,"status":%q,"card":"4111-1111-1111-%04d"}`, i, status, i)
}

// viewExpect is what a client of testView gets for record i: its value
// (nil: filtered out) and whether it is an error record.
func viewExpect(i int) (value string, kept, isErr bool) {
	switch {
	case i%10 == 7:
		return "", true, true
	case i%3 == 0:
		return "", false, false
	}
	return fmt.Sprintf(`{"card":"****%04d","n":%d,"status":"ok"}`, i, i), true, false
}

type pOff struct {
	p int32
	o int64
}

// produceDirect writes values to topic on the brokers themselves (not
// through the proxy), batched and compressed with codec; it returns each
// record's index by partition and offset.
func produceDirect(t *testing.T, upstream []string, topic string, from, n int, codec kgo.CompressionCodec, opts ...kgo.Opt) map[pOff]int {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(upstream...), kgo.ProducerLinger(20 * time.Millisecond),
		kgo.ProducerBatchCompression(codec), kgo.RecordPartitioner(kgo.RoundRobinPartitioner())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var mu sync.Mutex
	at := map[pOff]int{}
	var wg sync.WaitGroup
	for i := from; i < from+n; i++ {
		wg.Add(1)
		cl.Produce(context.Background(), &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i)), Value: []byte(viewInput(i)),
			Headers: []kgo.RecordHeader{{Key: "src", Value: []byte("x")}}}, func(r *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("produce %d: %v", i, err)
				return
			}
			mu.Lock()
			at[pOff{r.Partition, r.Offset}] = i
			mu.Unlock()
		})
	}
	wg.Wait()
	return at
}

// consumeView consumes topic through the proxy in group until want
// records arrived (or the deadline), then commits and closes.
func consumeView(t *testing.T, addr, clientID, group, topic string, want int, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.ClientID(clientID), kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
		kgo.FetchMaxWait(200 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []*kgo.Record
	for len(got) < want && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachError(func(tp string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("fetch %s[%d]: %v", tp, p, err)
			}
		})
		got = append(got, fs.Records()...)
	}
	if err := cl.CommitUncommittedOffsets(context.Background()); err != nil {
		t.Errorf("commit: %v", err)
	}
	return got
}

// checkViewRecords checks that got are exactly what testView makes of
// the records at (from among `at`).
func checkViewRecords(t *testing.T, got []*kgo.Record, at map[pOff]int, topic string, from int) {
	t.Helper()
	want := 0
	for _, i := range at {
		if _, kept, _ := viewExpect(i); kept && i >= from {
			want++
		}
	}
	seen := map[pOff]bool{}
	for _, r := range got {
		k := pOff{r.Partition, r.Offset}
		if seen[k] {
			t.Errorf("record %d/%d twice", r.Partition, r.Offset)
		}
		seen[k] = true
		i, ok := at[k]
		if !ok {
			t.Errorf("record at %d/%d was not produced", r.Partition, r.Offset)
			continue
		}
		if r.Topic != topic {
			t.Errorf("record %d: topic %q, want %q", i, r.Topic, topic)
		}
		if string(r.Key) != fmt.Sprint(i) {
			t.Errorf("record at %d/%d: key %q, want %d (offsets moved)", r.Partition, r.Offset, r.Key, i)
		}
		value, kept, isErr := viewExpect(i)
		switch {
		case !kept:
			t.Errorf("record %d (%s) should have been filtered out", i, r.Value)
		case isErr:
			if r.Value != nil || len(r.Headers) != 1 || r.Headers[0].Key != ViewErrorHeader || string(r.Headers[0].Value) != "value is not JSON" {
				t.Errorf("record %d: error record is value %q headers %v", i, r.Value, r.Headers)
			}
		default:
			if string(r.Value) != value {
				t.Errorf("record %d: value %s, want %s", i, r.Value, value)
			}
			if len(r.Headers) != 2 || r.Headers[0].Key != "src" || r.Headers[1].Key != "view" {
				t.Errorf("record %d: headers %v", i, r.Headers)
			}
		}
	}
	if len(seen) != want {
		t.Errorf("got %d records, want %d", len(seen), want)
	}
}

// A group consumes a virtual topic through the proxy: filtered records
// leave gaps, kept ones keep their offsets, keys and headers, the card is
// masked, a record the view cannot process arrives with a null value and
// the rtproxy-view-error header; the group commits, a new consumer of the
// group resumes after the committed records, and every Fetch version from
// 4 to the newest works; a zstd input is re-encoded (the client decodes
// it, checking the CRC).
func TestViewVirtualTopicGroupConsume(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:2")
	tp := startProxy(t, upstream, func(c *Config) { c.MaxHeldBytes = 64 << 20 })
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}})
	at := produceDirect(t, upstream, "pay", 0, 120, kgo.ZstdCompression())

	for _, fv := range []int16{4, 7, 11, 12, 13, 16, 17} {
		t.Run(fmt.Sprintf("fetch_v%d", fv), func(t *testing.T) {
			versions := kversion.Stable()
			versions.SetMaxKeyVersion(int16(kmsg.Fetch), fv)
			group := fmt.Sprintf("g%d", fv)
			want := 0
			for _, i := range at {
				if _, kept, _ := viewExpect(i); kept {
					want++
				}
			}
			got := consumeView(t, tp.Addr(), "c1", group, "pay.analytics", want, kgo.MaxVersions(versions))
			checkViewRecords(t, got, at, "pay.analytics", 0)

			// The group committed under the view's name: a new member
			// resumes after what it got.
			more := produceDirect(t, upstream, "pay", 1000, 30, kgo.ZstdCompression())
			want2 := 0
			for _, i := range more {
				if _, kept, _ := viewExpect(i); kept {
					want2++
				}
			}
			got2 := consumeView(t, tp.Addr(), "c1", group, "pay.analytics", want2, kgo.MaxVersions(versions))
			checkViewRecords(t, got2, more, "pay.analytics", 1000)
			for k, i := range more {
				at[k] = i // later subtests read these too
			}
		})
	}
	if v := metricValue(t, tp.vm.records.WithLabelValues("pay.analytics", "error")); v == 0 {
		t.Errorf("rtproxy_proxy_view_records_total{outcome=error} did not move")
	}
	if v := metricValue(t, tp.vm.records.WithLabelValues("pay.analytics", "filtered")); v == 0 {
		t.Errorf("rtproxy_proxy_view_records_total{outcome=filtered} did not move")
	}
}

// Metadata lists a virtual topic with the real one's partitions and a
// topic id of its own; ListOffsets and OffsetFetch answer under its name;
// a client the view does not apply to does not see it.
func TestViewMetadataAndOffsets(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:3")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay", clients: []string{"analyst"}}})
	produceDirect(t, upstream, "pay", 0, 30, kgo.NoCompression())
	ctx := context.Background()

	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("analyst"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	md, err := adm.Metadata(ctx, "pay.analytics")
	if err != nil {
		t.Fatal(err)
	}
	vt, ok := md.Topics["pay.analytics"]
	if !ok || vt.Err != nil || len(vt.Partitions) != 3 {
		t.Fatalf("metadata for the view: %+v", md.Topics)
	}
	if _, ok := md.Topics["pay"]; ok {
		t.Errorf("the real topic is listed though only the view was asked for")
	}
	if vt.ID != kadm.TopicID(viewTopicID("pay.analytics")) {
		t.Errorf("view topic id %v, want %v", vt.ID, viewTopicID("pay.analytics"))
	}
	all, err := adm.Metadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := all.Topics["pay.analytics"]; !ok {
		t.Errorf("metadata for every topic does not list the view: %v", all.Topics.Names())
	}
	if _, ok := all.Topics["pay"]; !ok {
		t.Errorf("metadata for every topic does not list the real topic")
	}
	ends, err := adm.ListEndOffsets(ctx, "pay.analytics")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil || o.Topic != "pay.analytics" {
			t.Errorf("end offset %+v", o)
		}
		total += o.Offset
	})
	if total != 30 {
		t.Errorf("end offsets of the view sum to %d, want 30", total)
	}

	// Someone else: no view.
	other, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("someone"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	omd, err := kadm.NewClient(other).Metadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := omd.Topics["pay.analytics"]; ok {
		t.Errorf("a client the view does not name sees it")
	}
}

// A view in place (on the real topic's name) applies to the clients it
// names only; every other client fetches the originals, on the path
// without views.
func TestViewInPlaceOnlyForNamedClients(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay", topic: "pay", clients: []string{"analyst"}}})
	at := produceDirect(t, upstream, "pay", 0, 40, kgo.SnappyCompression())
	want := 0
	for _, i := range at {
		if _, kept, _ := viewExpect(i); kept {
			want++
		}
	}
	got := consumeView(t, tp.Addr(), "analyst", "ga", "pay", want)
	checkViewRecords(t, got, at, "pay", 0)

	orig := consumeView(t, tp.Addr(), "someone", "gb", "pay", 40)
	if len(orig) != 40 {
		t.Fatalf("the other client got %d records, want the 40 originals", len(orig))
	}
	for _, r := range orig {
		if i := at[pOff{r.Partition, r.Offset}]; string(r.Value) != viewInput(i) {
			t.Errorf("the other client got %s at %d, want the original %s", r.Value, r.Offset, viewInput(i))
		}
	}
}

// Producing to a virtual topic is refused by the proxy with
// INVALID_TOPIC_EXCEPTION and a message; nothing reaches the broker.
func TestViewProduceRefused(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}})
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0), kgo.RecordRetries(1),
		kgo.RequestRetries(1), kgo.ProduceRequestTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// franz-go asks for the topic's metadata first; it sees the view's.
	err = cl.ProduceSync(ctx, &kgo.Record{Topic: "pay.analytics", Value: []byte("x")}).FirstErr()
	if !errors.Is(err, kerr.InvalidTopicException) {
		t.Fatalf("produce to the view: %v, want INVALID_TOPIC_EXCEPTION", err)
	}
	// The raw answer carries the message (by name up to v12, by the
	// view's topic id from v13 on).
	v9 := kversion.Stable()
	v9.SetMaxKeyVersion(int16(kmsg.Produce), 9)
	cl9, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.MaxVersions(v9))
	if err != nil {
		t.Fatal(err)
	}
	defer cl9.Close()
	req := kmsg.NewPtrProduceRequest()
	req.Version = 9
	req.Acks = -1
	req.TimeoutMillis = 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "pay.analytics"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = recordBatch("x")
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl9)
	if err != nil {
		t.Fatal(err)
	}
	p := resp.Topics[0].Partitions[0]
	if p.ErrorCode != kerr.InvalidTopicException.Code || p.ErrorMessage == nil || !strings.Contains(*p.ErrorMessage, "is a view") {
		t.Errorf("raw produce v9: code %d message %v", p.ErrorCode, p.ErrorMessage)
	}
	req.Version = 13
	req.Topics[0].TopicID = viewTopicID("pay.analytics")
	if resp, err = req.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if p := resp.Topics[0].Partitions[0]; p.ErrorCode != kerr.InvalidTopicException.Code {
		t.Errorf("raw produce v13 by the view's id: code %d message %v", p.ErrorCode, p.ErrorMessage)
	}
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "pay")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ends.Lookup("pay", 0); o.Offset != 0 {
		t.Errorf("the real topic got %d records", o.Offset)
	}
	if v := metricValue(t, tp.vm.refused.WithLabelValues("Produce")); v < 1 {
		t.Errorf("rtproxy_proxy_view_refused_total did not move")
	}
}

// A transactional producer's aborted records stay invisible to a
// read_committed consumer of a view; the committed ones arrive through the
// view (control batches pass as they are).
func TestViewReadCommittedSkipsAborted(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}})
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(upstream...), kgo.TransactionalID("view-txn"), kgo.ProducerLinger(0),
		kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	txn := func(from, n int, commit bool) {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := from; i < from+n; i++ {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "pay", Key: []byte(fmt.Sprint(i)), Value: []byte(viewInput(i))}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	txn(1, 5, true)    // 1..5
	txn(100, 5, false) // aborted
	txn(11, 5, true)   // 11..15
	want := map[string]bool{}
	for _, i := range []int{1, 2, 4, 5, 11, 13, 14} {
		want[fmt.Sprint(i)] = true
	}
	got := consumeView(t, tp.Addr(), "c", "gtx", "pay.analytics", len(want), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	for _, r := range got {
		if !want[string(r.Key)] {
			t.Errorf("read_committed got record %s (%s)", r.Key, r.Value)
		}
		delete(want, string(r.Key))
	}
	if len(want) != 0 {
		t.Errorf("read_committed did not get %v", want)
	}
}

// With views in force, a fetch that names no view for its client stays on
// the path without views: no decode, no allocation (the per-connection
// cache answers once warm); the request is forwarded as it is.
func TestViewFetchWithoutViewNoAlloc(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	vs := Views(testViews{{name: "pay", topic: "pay", clients: []string{"analyst"}}, {name: "v", topic: "pay", clients: []string{"analyst"}}})
	for _, version := range []int16{4, 12, 13, 17} {
		req := kmsg.NewPtrFetchRequest()
		req.Version = version
		req.SessionEpoch = -1
		for _, name := range []string{"pay", "other"} {
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic = name
			rt.TopicID[0] = byte(len(name))
			rt.Partitions = append(rt.Partitions, kmsg.NewFetchRequestTopicPartition())
			req.Topics = append(req.Topics, rt)
		}
		frame := rawRequest(req, 1)
		pr := &pair{p: tp.Proxy}
		h, err := ParseRequestHeader(frame[4:])
		if err != nil {
			t.Fatal(err)
		}
		h.ClientID = []byte("someone")
		run := func() {
			out, rest, vr, err := pr.viewRequest(&vs, h, frame, 0)
			if err != nil || vr != nil || rest != 0 || &out[0] != &frame[0] {
				t.Fatalf("v%d: a fetch without view was rewritten (%v, %v)", version, vr, err)
			}
		}
		run()
		if n := testing.AllocsPerRun(100, run); n != 0 {
			t.Errorf("fetch v%d without a view: %v allocations per request", version, n)
		}
		// The client the view names takes the view path.
		h.ClientID = []byte("analyst")
		if version < 13 {
			if _, _, vr, err := pr.viewRequest(&vs, h, slices.Clone(frame), 0); err != nil || vr == nil {
				t.Errorf("v%d: the named client's fetch did not take the view path (%v)", version, err)
			}
		}
	}
}

// checkInPlace consumes pay through the proxy (opts say who) and checks
// it gets the view's records when masked, the originals otherwise.
func checkInPlace(t *testing.T, addr, group string, at map[pOff]int, masked bool, opts ...kgo.Opt) {
	t.Helper()
	want := len(at)
	if masked {
		want = 0
		for _, i := range at {
			if _, kept, _ := viewExpect(i); kept {
				want++
			}
		}
	}
	got := consumeView(t, addr, "any-client-id", group, "pay", want, opts...)
	if masked {
		checkViewRecords(t, got, at, "pay", 0)
		return
	}
	if len(got) != len(at) {
		t.Fatalf("got %d records, want the %d originals", len(got), len(at))
	}
	for _, r := range got {
		if i := at[pOff{r.Partition, r.Offset}]; string(r.Value) != viewInput(i) {
			t.Errorf("got %s, want the original %s", r.Value, viewInput(i))
		}
	}
}

// A view names its clients by TLS certificate subject: the proxy reads
// it from the client certificate when it terminates TLS.
func TestViewClientByTLSSubject(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	serverCert, serverPool := selfSigned(t, "proxy")
	analyst, _ := selfSigned(t, "analyst")
	other, _ := selfSigned(t, "other")
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(analyst.Leaf)
	clientCAs.AddCert(other.Leaf)
	tp := startProxy(t, upstream, func(c *Config) {
		c.ClientTLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs}
	})
	tp.SetViews(testViews{{name: "pay", topic: "pay", clients: []string{"tls:CN=analyst"}}})
	at := produceDirect(t, upstream, "pay", 0, 20, kgo.Lz4Compression())
	dial := func(c tls.Certificate) kgo.Opt {
		return kgo.DialTLSConfig(&tls.Config{RootCAs: serverPool, Certificates: []tls.Certificate{c}})
	}
	checkInPlace(t, tp.Addr(), "g-analyst", at, true, dial(analyst))
	checkInPlace(t, tp.Addr(), "g-other", at, false, dial(other))
}

// A view names its clients by SASL principal: the proxy reads the
// username as SaslAuthenticate passes and adopts it when the broker
// accepts the authentication.
func TestViewClientBySASLPrincipal(t *testing.T) {
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			upstream := startKfake(t, "-sasl", mech+":admin:s3cret", "-topics", "pay:1")
			tp := startProxyNoWait(t, upstream)
			auth := kgo.SASL(plain.Auth{User: "admin", Pass: "s3cret"}.AsMechanism())
			if mech != "PLAIN" {
				auth = kgo.SASL(scram.Auth{User: "admin", Pass: "s3cret"}.AsSha512Mechanism())
			}
			at := produceDirect(t, upstream, "pay", 0, 20, kgo.GzipCompression(), auth)
			tp.SetViews(testViews{{name: "pay", topic: "pay", clients: []string{"principal:User:admin"}}})
			checkInPlace(t, tp.Addr(), "g-admin", at, true, auth)
			tp.SetViews(testViews{{name: "pay", topic: "pay", clients: []string{"principal:someone-else"}}})
			checkInPlace(t, tp.Addr(), "g-other", at, false, auth)
		})
	}
}

func TestSASLUsername(t *testing.T) {
	jwt := func(claims string) string {
		return "x." + base64.RawURLEncoding.EncodeToString([]byte(claims)) + ".sig"
	}
	for _, tc := range []struct {
		mech, msg, want string
	}{
		{"PLAIN", "\x00alice\x00pw", "alice"},
		{"PLAIN", "admin\x00alice\x00pw", "alice"},
		{"PLAIN", "alice", ""},
		{"SCRAM-SHA-256", "n,,n=al=2Cice=3D,r=abc", "al,ice="},
		{"SCRAM-SHA-512", "n,a=x,n=bob,r=abc", "bob"},
		{"SCRAM-SHA-256", "c=biws,r=abc,p=xyz", ""},
		{"OAUTHBEARER", "n,,\x01auth=Bearer " + jwt(`{"sub":"svc"}`) + "\x01\x01", "svc"},
		{"OAUTHBEARER", "n,,\x01auth=Bearer nonsense\x01\x01", ""},
		{"GSSAPI", "anything", ""},
	} {
		if got := saslUsername(tc.mech, []byte(tc.msg)); got != tc.want {
			t.Errorf("%s %q: %q, want %q", tc.mech, tc.msg, got, tc.want)
		}
	}
}

// A fetch through a view reads its response whole, within
// proxy.max_held_bytes: the request asks the broker for at most a
// quarter of it, and the response and its rewrite are reserved together.
func TestViewFetchWithinMaxHeldBytes(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	const maxHeld = 1 << 20
	tp := startProxy(t, upstream, func(c *Config) { c.MaxHeldBytes = maxHeld })
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}})
	cl, err := kgo.NewClient(kgo.SeedBrokers(upstream...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchMaxBytes(64<<10), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pad := strings.Repeat("p", 900)
	const n = 6000 // ~6 MiB
	for i := range n {
		v := fmt.Sprintf(`{"n":%d,"status":"ok","card":"4111-1111-1111-%04d","pad":%q}`, i, i, pad)
		cl.Produce(context.Background(), &kgo.Record{Topic: "pay", Value: []byte(v)}, nil)
	}
	if err := cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := consumeView(t, tp.Addr(), "c", "gh", "pay.analytics", n)
	if len(got) != n {
		t.Fatalf("got %d records, want %d", len(got), n)
	}
	for i, r := range got {
		if !strings.Contains(string(r.Value), `"card":"****`) || r.Offset != int64(i) {
			t.Fatalf("record %d at %d: %.60s", i, r.Offset, r.Value)
		}
	}
	if peak := tp.held.peakBytes(); peak > maxHeld || peak == 0 {
		t.Errorf("held peak %d bytes, bound %d (0: the responses were not counted)", peak, maxHeld)
	}
}

// A Fetch v16+ through a view keeps the KIP-951 answer: CurrentLeader and
// the node endpoints (rewritten to the proxy as without a view) survive
// the view's rewrite, and the topic id goes back to the view's.
func TestViewFetchKeepsNodeEndpoints(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	var realID [16]byte
	for deadline := time.Now().Add(5 * time.Second); ; {
		id, ok := tp.topicID("pay")
		if ok {
			realID = id
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the proxy never learnt pay's topic id")
		}
		time.Sleep(20 * time.Millisecond)
	}
	vs := Views(testViews{{name: "pay.analytics", topic: "pay"}})
	pr := &pair{p: tp.Proxy, done: make(chan struct{})}

	req := kmsg.NewPtrFetchRequest()
	req.Version, req.SessionEpoch, req.MaxWaitMillis = 16, -1, 100
	rt := kmsg.NewFetchRequestTopic()
	rt.TopicID = viewTopicID("pay.analytics")
	rt.Partitions = append(rt.Partitions, kmsg.NewFetchRequestTopicPartition())
	req.Topics = append(req.Topics, rt)
	frame := rawRequest(req, 7)
	h, err := ParseRequestHeader(frame[4:])
	if err != nil {
		t.Fatal(err)
	}
	out, _, vr, err := pr.viewRequest(&vs, h, frame, 0)
	if err != nil || vr == nil {
		t.Fatalf("view request: %v %v", vr, err)
	}
	sent := kmsg.NewPtrFetchRequest()
	sent.Version = 16
	if err := sent.ReadFrom(out[4+h.BodyOffset:]); err != nil || sent.Topics[0].TopicID != realID {
		t.Fatalf("the broker is asked for %v (%v), want the real id %v", sent.Topics[0].TopicID, err, realID)
	}

	resp := kmsg.NewPtrFetchResponse()
	resp.Version = 16
	rtp := kmsg.NewFetchResponseTopic()
	rtp.TopicID = realID
	pp := kmsg.NewFetchResponseTopicPartition()
	pp.CurrentLeader.LeaderID, pp.CurrentLeader.LeaderEpoch = 2, 9
	pp.RecordBatches = viewBatchSeed(t, 0, kgo.ZstdCompression(), viewInput(1), viewInput(2))
	rtp.Partitions = append(rtp.Partitions, pp)
	resp.Topics = append(resp.Topics, rtp)
	resp.Brokers = append(resp.Brokers, kmsg.FetchResponseBroker{NodeID: 2, Host: "10.9.9.9", Port: 9092})
	body := resp.AppendTo(nil)
	rframe := binary.BigEndian.AppendUint32(make([]byte, 4), 7)
	rframe = append(rframe, 0) // response header tags
	rframe = append(rframe, body...)
	binary.BigEndian.PutUint32(rframe, uint32(len(rframe)-4))
	in := inflight{key: int16(kmsg.Fetch), version: 16, corr: 7, view: vr}
	mapped, err := pr.rewrite(rewriteFetch, in, rframe) // as brokerLoop does first
	if err != nil || mapped == nil {
		t.Fatalf("endpoints not rewritten: %v", err)
	}
	final, err := pr.viewResponse(in, mapped)
	if err != nil {
		t.Fatal(err)
	}
	got := kmsg.NewPtrFetchResponse()
	got.Version = 16
	if err := got.ReadFrom(final[4+5:]); err != nil {
		t.Fatal(err)
	}
	if len(got.Brokers) != 1 || !tp.isProxyAddr(got.Brokers[0].Host, got.Brokers[0].Port) || got.Brokers[0].NodeID != 2 {
		t.Errorf("node endpoints %+v, want node 2 at the proxy", got.Brokers)
	}
	gp := got.Topics[0].Partitions[0]
	if got.Topics[0].TopicID != viewTopicID("pay.analytics") || gp.CurrentLeader.LeaderID != 2 || gp.CurrentLeader.LeaderEpoch != 9 {
		t.Errorf("topic %v, current leader %+v", got.Topics[0].TopicID, gp.CurrentLeader)
	}
	recs, ok := refDecode(gp.RecordBatches)
	if !ok || len(recs) != 1 || len(recs[0].recs) != 2 || !strings.Contains(string(recs[0].recs[0].value), `"card":"****0001"`) {
		t.Errorf("records %+v", recs)
	}
}

// Views removed while a client's fetch session (KIP-227) holds a virtual
// topic: the session's incremental fetch names no topic, and the broker's
// answer carries the real topic's new records; they must not reach the
// client, in clear or at all (its partitions answer
// UNKNOWN_TOPIC_OR_PARTITION under the view's name).
func TestViewRemovedDuringSession(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}})
	produceDirect(t, upstream, "pay", 1, 2, kgo.NoCompression())
	v12 := kversion.Stable()
	v12.SetMaxKeyVersion(int16(kmsg.Fetch), 12) // by name
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("c"), kgo.MaxVersions(v12))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).Metadata(ctx, "pay.analytics")
	if err != nil {
		t.Fatal(err)
	}
	leader := md.Topics["pay.analytics"].Partitions[0].Leader
	fetch := func(sessionID, epoch int32, topics ...string) *kmsg.FetchResponse {
		req := kmsg.NewPtrFetchRequest()
		req.Version, req.ReplicaID, req.MaxWaitMillis, req.MaxBytes = 12, -1, 100, 1<<20
		req.SessionID, req.SessionEpoch = sessionID, epoch
		for _, name := range topics {
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic = name
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.PartitionMaxBytes, rp.LogStartOffset = 1<<20, -1
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
		}
		resp, err := req.RequestWith(ctx, cl.Broker(int(leader)))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := fetch(0, 0, "pay.analytics")
	if first.SessionID == 0 || len(first.Topics) != 1 || first.Topics[0].Topic != "pay.analytics" {
		t.Fatalf("first fetch: session %d, topics %+v", first.SessionID, first.Topics)
	}
	tp.SetViews(nil)
	produceDirect(t, upstream, "pay", 10, 2, kgo.NoCompression())
	next := fetch(first.SessionID, 1)
	for _, rt := range next.Topics {
		for _, p := range rt.Partitions {
			if len(p.RecordBatches) > 0 {
				t.Errorf("after the view went away the session's answer carries %d bytes of records under %q", len(p.RecordBatches), rt.Topic)
			}
			if rt.Topic == "pay.analytics" && p.ErrorCode != kerr.UnknownTopicOrPartition.Code {
				t.Errorf("the view's partition answers error %d", p.ErrorCode)
			}
		}
		if rt.Topic == "pay" {
			t.Errorf("the session's answer names the real topic, which the client never asked for")
		}
	}
}
