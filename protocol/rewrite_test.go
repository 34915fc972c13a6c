package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// fakeMapper maps node n to proxy.local:9000+n and remembers what it saw.
type fakeMapper struct {
	upstream map[int32]string
	topics   map[[16]byte]string
	fail     bool
}

func newFakeMapper() *fakeMapper {
	return &fakeMapper{upstream: map[int32]string{}, topics: map[[16]byte]string{}}
}

func (f *fakeMapper) MapBroker(node int32, host string, port int32) (string, int32, error) {
	if f.fail {
		return "", 0, ErrPortRangeExhausted
	}
	f.upstream[node] = fmt.Sprintf("%s:%d", host, port)
	return "proxy.local", 9000 + node, nil
}

func (f *fakeMapper) LearnTopic(id [16]byte, name string) { f.topics[id] = name }

// runRewrite encodes resp, rewrites it with the rewriter for its key and
// decodes the result into a fresh response of the same kind.
func runRewrite(t *testing.T, m Mapper, resp kmsg.Response) (kmsg.Response, bool) {
	t.Helper()
	body := resp.AppendTo(nil)
	rw := rewriterFor(resp.Key())
	prefix := []byte("HDR")
	out, changed, err := rw(m, resp.GetVersion(), body, prefix)
	if err != nil {
		t.Fatalf("rewrite %s v%d: %v", kmsg.NameForKey(resp.Key()), resp.GetVersion(), err)
	}
	if !changed {
		return nil, false
	}
	if !bytes.HasPrefix(out, prefix) {
		t.Fatalf("rewriter did not append to dst")
	}
	back := kmsg.ResponseForKey(resp.Key())
	back.SetVersion(resp.GetVersion())
	if err := back.ReadFrom(out[len(prefix):]); err != nil {
		t.Fatalf("decode rewritten %s v%d: %v", kmsg.NameForKey(resp.Key()), resp.GetVersion(), err)
	}
	return back, true
}

func TestRewriteMetadata(t *testing.T) {
	for v := int16(0); v <= 13; v++ {
		t.Run(fmt.Sprint("v", v), func(t *testing.T) {
			r := kmsg.NewPtrMetadataResponse()
			r.SetVersion(v)
			r.ControllerID = 1001
			for _, n := range []int32{1001, 1002, 7} {
				b := kmsg.NewMetadataResponseBroker()
				b.NodeID, b.Host, b.Port = n, fmt.Sprintf("broker-%d.internal", n), 9092
				r.Brokers = append(r.Brokers, b)
			}
			tp := kmsg.NewMetadataResponseTopic()
			tp.Topic = kmsg.StringPtr("orders")
			tp.TopicID = [16]byte{1, 2, 3}
			p := kmsg.NewMetadataResponseTopicPartition()
			p.Leader, p.Replicas, p.ISR = 1002, []int32{1002, 7}, []int32{1002}
			tp.Partitions = append(tp.Partitions, p)
			r.Topics = append(r.Topics, tp)

			m := newFakeMapper()
			got, changed := runRewrite(t, m, r)
			if !changed {
				t.Fatal("metadata must always be rewritten")
			}
			g := got.(*kmsg.MetadataResponse)
			for i, b := range g.Brokers {
				if b.Host != "proxy.local" || b.Port != 9000+b.NodeID || b.NodeID != r.Brokers[i].NodeID {
					t.Errorf("broker %d = %s:%d", b.NodeID, b.Host, b.Port)
				}
			}
			if m.upstream[1002] != "broker-1002.internal:9092" {
				t.Errorf("upstream for 1002 = %q", m.upstream[1002])
			}
			if v >= 1 && g.ControllerID != 1001 {
				t.Errorf("controller id = %d", g.ControllerID)
			}
			if gp := g.Topics[0].Partitions[0]; gp.Leader != 1002 || len(gp.Replicas) != 2 {
				t.Errorf("partition leader/replicas changed: %+v", gp)
			}
			if v >= 10 && m.topics[[16]byte{1, 2, 3}] != "orders" {
				t.Errorf("topic id not learned: %v", m.topics)
			}
		})
	}
}

func TestRewriteFindCoordinator(t *testing.T) {
	for v := int16(0); v <= 6; v++ {
		t.Run(fmt.Sprint("v", v), func(t *testing.T) {
			r := kmsg.NewPtrFindCoordinatorResponse()
			r.SetVersion(v)
			if v < 4 {
				r.NodeID, r.Host, r.Port = 3, "kafka-3", 19092
			} else {
				for i, k := range []string{"g1", "g2", "missing"} {
					c := kmsg.NewFindCoordinatorResponseCoordinator()
					c.Key, c.NodeID, c.Host, c.Port = k, int32(i+1), fmt.Sprintf("kafka-%d", i+1), 19092
					if k == "missing" {
						c.NodeID, c.Host, c.Port, c.ErrorCode = -1, "", -1, 15
					}
					r.Coordinators = append(r.Coordinators, c)
				}
			}
			got, _ := runRewrite(t, newFakeMapper(), r)
			g := got.(*kmsg.FindCoordinatorResponse)
			if v < 4 {
				if g.NodeID != 3 || g.Host != "proxy.local" || g.Port != 9003 {
					t.Fatalf("coordinator = %d %s:%d", g.NodeID, g.Host, g.Port)
				}
				return
			}
			for _, c := range g.Coordinators {
				switch c.Key {
				case "missing":
					if c.Host != "" || c.Port != -1 || c.ErrorCode != 15 {
						t.Errorf("errored entry changed: %+v", c)
					}
				default:
					if c.Host != "proxy.local" || c.Port != 9000+c.NodeID {
						t.Errorf("%s = %d %s:%d", c.Key, c.NodeID, c.Host, c.Port)
					}
				}
			}
		})
	}
}

func TestRewriteDescribeCluster(t *testing.T) {
	for v := int16(0); v <= 2; v++ {
		r := kmsg.NewPtrDescribeClusterResponse()
		r.SetVersion(v)
		r.ControllerID = 2
		for n := int32(0); n < 3; n++ {
			b := kmsg.NewDescribeClusterResponseBroker()
			b.NodeID, b.Host, b.Port = n, "10.0.0.1", 9092+n
			r.Brokers = append(r.Brokers, b)
		}
		got, _ := runRewrite(t, newFakeMapper(), r)
		g := got.(*kmsg.DescribeClusterResponse)
		if g.ControllerID != 2 || len(g.Brokers) != 3 {
			t.Fatalf("v%d: %+v", v, g)
		}
		for _, b := range g.Brokers {
			if b.Host != "proxy.local" || b.Port != 9000+b.NodeID {
				t.Errorf("v%d broker %d = %s:%d", v, b.NodeID, b.Host, b.Port)
			}
		}
	}
}

func produceResponse(v int16, withEndpoint bool) *kmsg.ProduceResponse {
	r := kmsg.NewPtrProduceResponse()
	r.SetVersion(v)
	r.ThrottleMillis = 5
	t := kmsg.NewProduceResponseTopic()
	t.Topic = "orders"
	t.TopicID = [16]byte{9}
	p := kmsg.NewProduceResponseTopicPartition()
	p.BaseOffset = 42
	if v >= 8 {
		e := kmsg.NewProduceResponseTopicPartitionErrorRecord()
		e.RelativeOffset, e.ErrorMessage = 1, kmsg.StringPtr("bad record")
		p.ErrorRecords = append(p.ErrorRecords, e)
		p.ErrorMessage = kmsg.StringPtr("partial")
	}
	if withEndpoint {
		p.ErrorCode = 6 // NOT_LEADER_OR_FOLLOWER
		p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = 1002, 4
		b := kmsg.NewProduceResponseBroker()
		b.NodeID, b.Host, b.Port, b.Rack = 1002, "kafka-1002", 9092, kmsg.StringPtr("rack-a")
		r.Brokers = append(r.Brokers, b)
	}
	t.Partitions = append(t.Partitions, p)
	r.Topics = append(r.Topics, t)
	return r
}

func TestRewriteProduce(t *testing.T) {
	for v := int16(0); v <= 13; v++ {
		if _, changed := runRewrite(t, newFakeMapper(), produceResponse(v, false)); changed {
			t.Errorf("v%d without endpoints must be forwarded raw", v)
		}
		if v < 10 {
			// KIP-951 endpoints exist from v10 on: a v9 response is
			// forwarded as it is, and so can stream (needsBody).
			if _, changed := runRewrite(t, newFakeMapper(), produceResponse(v, true)); changed && v >= 9 {
				t.Errorf("v%d is below KIP-951's v10 and must be forwarded raw", v)
			}
			continue
		}
		got, changed := runRewrite(t, newFakeMapper(), produceResponse(v, true))
		if !changed {
			t.Fatalf("v%d with endpoints not rewritten", v)
		}
		g := got.(*kmsg.ProduceResponse)
		b := g.Brokers[0]
		if b.NodeID != 1002 || b.Host != "proxy.local" || b.Port != 10002 || *b.Rack != "rack-a" {
			t.Errorf("v%d endpoint = %+v", v, b)
		}
		if cl := g.Topics[0].Partitions[0].CurrentLeader; cl.LeaderID != b.NodeID || cl.LeaderEpoch != 4 {
			t.Errorf("v%d current leader %+v inconsistent with endpoint %d", v, cl, b.NodeID)
		}
		if g.Topics[0].Partitions[0].BaseOffset != 42 || g.ThrottleMillis != 5 {
			t.Errorf("v%d other fields changed", v)
		}
	}
}

func fetchResponse(v int16, withEndpoint bool) *kmsg.FetchResponse {
	r := kmsg.NewPtrFetchResponse()
	r.SetVersion(v)
	r.SessionID = 77
	t := kmsg.NewFetchResponseTopic()
	t.Topic = "orders"
	t.TopicID = [16]byte{9}
	p := kmsg.NewFetchResponseTopicPartition()
	p.HighWatermark = 100
	a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
	a.ProducerID, a.FirstOffset = 5, 6
	p.AbortedTransactions = append(p.AbortedTransactions, a)
	p.RecordBatches = recordBatch("payload")
	p.DivergingEpoch.Epoch = 3 // a partition tag, which must not be mistaken for a top-level one
	if withEndpoint {
		p.ErrorCode = 6
		p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = 2, 8
		b := kmsg.NewFetchResponseBroker()
		b.NodeID, b.Host, b.Port = 2, "kafka-2", 9092
		r.Brokers = append(r.Brokers, b)
	}
	t.Partitions = append(t.Partitions, p)
	r.Topics = append(r.Topics, t)
	return r
}

func TestRewriteFetch(t *testing.T) {
	for v := int16(0); v <= 18; v++ {
		if _, changed := runRewrite(t, newFakeMapper(), fetchResponse(v, false)); changed {
			t.Errorf("v%d without endpoints must be forwarded raw", v)
		}
		if v < 16 {
			// KIP-951 endpoints exist from v16 on: v12-v15 are flexible,
			// but a response is forwarded as it is, and so can stream.
			if _, changed := runRewrite(t, newFakeMapper(), fetchResponse(v, true)); changed && v >= 12 {
				t.Errorf("v%d is below KIP-951's v16 and must be forwarded raw", v)
			}
			continue
		}
		in := fetchResponse(v, true)
		// The batch carries a wall-clock timestamp: compare with this one,
		// not a second recordBatch call a millisecond later.
		sent := in.Topics[0].Partitions[0].RecordBatches
		got, changed := runRewrite(t, newFakeMapper(), in)
		if !changed {
			t.Fatalf("v%d with endpoints not rewritten", v)
		}
		g := got.(*kmsg.FetchResponse)
		b := g.Brokers[0]
		if b.NodeID != 2 || b.Host != "proxy.local" || b.Port != 9002 {
			t.Errorf("v%d endpoint = %+v", v, b)
		}
		gp := g.Topics[0].Partitions[0]
		if gp.CurrentLeader.LeaderID != 2 || !bytes.Equal(gp.RecordBatches, sent[:len(gp.RecordBatches)]) ||
			len(gp.RecordBatches) == 0 || g.SessionID != 77 {
			t.Errorf("v%d other fields changed: %+v", v, gp)
		}
	}
}

func TestRewriteShare(t *testing.T) {
	sf := kmsg.NewPtrShareFetchResponse()
	sf.SetVersion(1)
	if _, changed := runRewrite(t, newFakeMapper(), sf); changed {
		t.Error("ShareFetch without endpoints must be forwarded raw")
	}
	e := kmsg.NewShareFetchResponseNodeEndpoint()
	e.NodeID, e.Host, e.Port = 4, "kafka-4", 9092
	sf.NodeEndpoints = append(sf.NodeEndpoints, e)
	got, changed := runRewrite(t, newFakeMapper(), sf)
	if ge := got.(*kmsg.ShareFetchResponse).NodeEndpoints[0]; !changed || ge.Host != "proxy.local" || ge.Port != 9004 || ge.NodeID != 4 {
		t.Errorf("ShareFetch endpoint = %+v", ge)
	}

	sa := kmsg.NewPtrShareAcknowledgeResponse()
	sa.SetVersion(1)
	if _, changed := runRewrite(t, newFakeMapper(), sa); changed {
		t.Error("ShareAcknowledge without endpoints must be forwarded raw")
	}
	ae := kmsg.NewShareAcknowledgeResponseNodeEndpoint()
	ae.NodeID, ae.Host, ae.Port = 5, "kafka-5", 9092
	sa.NodeEndpoints = append(sa.NodeEndpoints, ae)
	got, changed = runRewrite(t, newFakeMapper(), sa)
	if ge := got.(*kmsg.ShareAcknowledgeResponse).NodeEndpoints[0]; !changed || ge.Host != "proxy.local" || ge.Port != 9005 {
		t.Errorf("ShareAcknowledge endpoint = %+v", ge)
	}
}

func TestRewriteApiVersionsIntersection(t *testing.T) {
	for _, v := range []int16{0, 1, 2, 3, 4} {
		r := kmsg.NewPtrApiVersionsResponse()
		r.SetVersion(v)
		add := func(k, min, max int16) {
			a := kmsg.NewApiVersionsResponseApiKey()
			a.ApiKey, a.MinVersion, a.MaxVersion = k, min, max
			r.ApiKeys = append(r.ApiKeys, a)
		}
		add(0, 0, 99)  // Produce: capped to kmsg's max
		add(3, 0, 4)   // Metadata: below kmsg's max, kept
		add(18, 0, 4)  // ApiVersions
		add(120, 0, 1) // a key kmsg does not know: dropped
		add(1, 50, 60) // Fetch with a range entirely above kmsg: dropped
		add(17, 0, 1)  // SaslHandshake: v0 (unframed tokens) removed
		got, changed := runRewrite(t, nil, r)
		if !changed {
			t.Fatal("ApiVersions must be rewritten")
		}
		keys := map[int16][2]int16{}
		for _, k := range got.(*kmsg.ApiVersionsResponse).ApiKeys {
			keys[k.ApiKey] = [2]int16{k.MinVersion, k.MaxVersion}
		}
		want := map[int16][2]int16{0: {0, kmsgMax[0]}, 3: {0, 4}, 18: {0, 4}, 17: {1, 1}}
		if fmt.Sprint(keys) != fmt.Sprint(want) {
			t.Errorf("v%d keys = %v, want %v", v, keys, want)
		}
	}
}

func TestRewriteApiVersionsUnsupportedFallback(t *testing.T) {
	// The client asked v4; the broker only speaks up to v2 and answers
	// UNSUPPORTED_VERSION in v0 format.
	r := kmsg.NewPtrApiVersionsResponse()
	r.SetVersion(0)
	r.ErrorCode = errUnsupportedVersion
	a := kmsg.NewApiVersionsResponseApiKey()
	a.ApiKey, a.MaxVersion = 18, 2
	r.ApiKeys = append(r.ApiKeys, a)
	body := r.AppendTo(nil)
	out, changed, err := rewriteApiVersions(nil, 4, body, nil)
	if err != nil || !changed {
		t.Fatalf("fallback: changed=%v err=%v", changed, err)
	}
	var back kmsg.ApiVersionsResponse
	back.SetVersion(0)
	if err := back.ReadFrom(out); err != nil {
		t.Fatalf("fallback answer is not v0: %v", err)
	}
	if back.ErrorCode != errUnsupportedVersion || len(back.ApiKeys) != 1 || back.ApiKeys[0].MaxVersion != 2 {
		t.Fatalf("fallback answer = %+v", back)
	}
}

func TestRewriteErrors(t *testing.T) {
	for key, rw := range rewriters {
		if _, _, err := rw(newFakeMapper(), 0, []byte{0xff}, nil); err == nil && key != int16(kmsg.Produce) && key != int16(kmsg.Fetch) {
			t.Errorf("%s: garbage body accepted", kmsg.NameForKey(key))
		}
	}
	// A body the walker cannot follow still reaches the decoder's error.
	if _, _, err := rewriteFetch(newFakeMapper(), 16, []byte{1, 2, 3}, nil); err == nil {
		t.Error("Fetch v16 garbage accepted")
	}
	// Port range exhausted: the rewrite fails rather than leak an address.
	m := newFakeMapper()
	m.fail = true
	empty := kmsg.NewPtrMetadataResponse()
	empty.SetVersion(9)
	_, _, err := rewriteMetadata(m, 9, empty.AppendTo(nil), nil)
	if err != nil {
		t.Fatalf("metadata without brokers needs no port: %v", err)
	}
	md := kmsg.NewPtrMetadataResponse()
	md.Brokers = append(md.Brokers, kmsg.NewMetadataResponseBroker())
	if _, _, err := rewriteMetadata(m, 0, md.AppendTo(nil), nil); !errors.Is(err, ErrPortRangeExhausted) {
		t.Fatalf("err = %v, want ErrPortRangeExhausted", err)
	}
}
