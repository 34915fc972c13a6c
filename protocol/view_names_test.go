package protocol

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// One real topic under several names in one fetch (or one fetch session):
// the real name, a view on it and a second view on it. Each name gets its
// own records: the real name the originals, each view what it makes of
// them (its header names it).

// checkNamed checks the records fetched under one name: the originals for
// the real topic, the view's records (testView, its name in the "view"
// header) for a view; want counts the records expected.
func checkNamed(t *testing.T, name string, recs []refRecord, at map[pOff]int, partition int32) int {
	t.Helper()
	n := 0
	for _, r := range recs {
		i, ok := at[pOff{partition, r.offset}]
		if !ok {
			t.Errorf("%s: record at %d/%d was not produced", name, partition, r.offset)
			continue
		}
		n++
		if name == "pay" {
			if string(r.value) != viewInput(i) {
				t.Errorf("pay: got %s at %d, want the original %s", r.value, r.offset, viewInput(i))
			}
			for _, h := range r.headers {
				if h.Key == "view" || h.Key == ViewErrorHeader {
					t.Errorf("pay: the original record %d carries a view's header %v", i, h)
				}
			}
			continue
		}
		value, kept, isErr := viewExpect(i)
		switch {
		case !kept:
			t.Errorf("%s: record %d should have been filtered out", name, i)
		case isErr:
			if r.value != nil {
				t.Errorf("%s: error record %d has value %q", name, i, r.value)
			}
		default:
			if string(r.value) != value {
				t.Errorf("%s: record %d is %s, want %s", name, i, r.value, value)
			}
			if len(r.headers) != 2 || r.headers[1].Key != "view" || string(r.headers[1].Value) != name {
				t.Errorf("%s: record %d headers %v, want the view's own", name, i, r.headers)
			}
		}
	}
	return n
}

func wantNamed(name string, at map[pOff]int, from int64) int {
	n := 0
	for k, i := range at {
		if k.o < from {
			continue
		}
		if _, kept, _ := viewExpect(i); kept || name == "pay" {
			n++
		}
	}
	return n
}

// A raw fetch (by name up to v12, by id from v13 on; without a session and
// with one, full then incremental) naming pay, pay.analytics and pay.b,
// each at an offset of its own: every name gets its own records from its
// own offset, and the fetch session the client holds stays right.
func TestViewFetchOneTopicUnderSeveralNames(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}, {name: "pay.b", topic: "pay"}})
	at := produceDirect(t, upstream, "pay", 0, 30, kgo.ZstdCompression())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	md, err := kadm.NewClient(cl).Metadata(ctx, "pay", "pay.analytics", "pay.b")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string][16]byte{}
	for name, mt := range md.Topics {
		ids[name] = mt.ID
	}
	leader := md.Topics["pay"].Partitions[0].Leader
	names := []string{"pay", "pay.analytics", "pay.b"}

	for _, version := range []int16{4, 12, 13, 17} {
		for _, session := range []bool{false, true} {
			if session && version < 7 {
				continue
			}
			t.Run(fmt.Sprintf("v%d_session_%v", version, session), func(t *testing.T) {
				versions := kversion.Stable()
				versions.SetMaxKeyVersion(int16(kmsg.Fetch), version)
				cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("c"), kgo.MaxVersions(versions))
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				offsets := map[string]int64{"pay": 0, "pay.analytics": 5, "pay.b": 12}
				var sessionID, epoch int32 = 0, -1
				if session {
					epoch = 0
				}
				var resp *kmsg.FetchResponse
				fetch := func(which ...string) map[string][]refRecord {
					req := kmsg.NewPtrFetchRequest()
					req.Version, req.ReplicaID, req.MaxWaitMillis, req.MaxBytes = version, -1, 50, 1<<20
					req.SessionID, req.SessionEpoch = sessionID, epoch
					for _, name := range which {
						rt := kmsg.NewFetchRequestTopic()
						rt.Topic, rt.TopicID = name, ids[name]
						rp := kmsg.NewFetchRequestTopicPartition()
						rp.FetchOffset, rp.PartitionMaxBytes, rp.LogStartOffset = offsets[name], 1<<20, -1
						rt.Partitions = append(rt.Partitions, rp)
						req.Topics = append(req.Topics, rt)
					}
					resp, err = req.RequestWith(ctx, cl.Broker(int(leader)))
					if err != nil {
						t.Fatal(err)
					}
					if resp.ErrorCode != 0 {
						t.Fatalf("fetch error %v", kerr.ErrorForCode(resp.ErrorCode))
					}
					got := map[string][]refRecord{}
					nextOffsets := map[string]int64{}
					defer func() { maps.Copy(offsets, nextOffsets) }()
					for _, rt := range resp.Topics {
						name := rt.Topic
						if version >= 13 {
							name = ""
							for n, id := range ids {
								if id == rt.TopicID {
									name = n
								}
							}
						}
						if !slices.Contains(names, name) {
							t.Fatalf("the answer names a topic the client did not ask for: %q %v", rt.Topic, rt.TopicID)
						}
						for _, p := range rt.Partitions {
							if p.ErrorCode != 0 {
								t.Errorf("%s: partition error %v", name, kerr.ErrorForCode(p.ErrorCode))
							}
							batches, ok := refDecode(p.RecordBatches)
							if !ok {
								t.Fatalf("%s: record batches do not decode", name)
							}
							if _, dup := got[name]; dup {
								t.Errorf("%s answered twice", name)
							}
							got[name] = []refRecord{}
							next := offsets[name]
							for _, b := range batches {
								for _, r := range b.recs {
									if r.offset >= offsets[name] { // as clients skip what is before their offset
										got[name] = append(got[name], r)
									}
								}
								next = max(next, b.base+int64(b.lastDelta)+1)
							}
							nextOffsets[name] = next
						}
					}
					return got
				}
				from := maps.Clone(offsets)
				got := fetch(names...)
				for _, name := range names {
					if _, ok := got[name]; !ok {
						t.Errorf("%s: not in the answer", name)
					}
					if n, want := checkNamed(t, name, got[name], at, 0), wantNamed(name, at, from[name]); n != want {
						t.Errorf("%s: %d records from %d, want %d", name, n, from[name], want)
					}
				}
				if !session {
					return
				}
				// The session goes on: incremental fetches name what moved.
				sessionID = resp.SessionID
				if sessionID != 0 {
					epoch = 1
				}
				end := int64(len(at)) // one partition
				offsets = map[string]int64{"pay": end, "pay.analytics": end, "pay.b": end}
				more := produceDirect(t, upstream, "pay", 100*int(version), 6, kgo.NoCompression())
				for k, i := range more {
					at[k] = i // later subtests read these too
				}
				seen := map[string]int{}
				for range 5 {
					got = fetch(names...)
					if sessionID != 0 {
						epoch++
					}
					for name, recs := range got {
						seen[name] += checkNamed(t, name, recs, at, 0)
					}
					if seen["pay"] == 6 {
						break
					}
				}
				for _, name := range names {
					if want := wantNamed(name, more, 0); seen[name] != want {
						t.Errorf("%s: the next fetches got %d records, want %d", name, seen[name], want)
					}
				}
			})
		}
	}
}

// A franz-go consumer of pay, pay.analytics and pay.b at once (one fetch,
// one fetch session per broker, by topic id): each topic gets its own
// records, all of them.
func TestViewConsumeTopicAndItsViews(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:2")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}, {name: "pay.b", topic: "pay"}})
	at := produceDirect(t, upstream, "pay", 0, 60, kgo.SnappyCompression())
	for _, fv := range []int16{12, 17} {
		t.Run(fmt.Sprintf("fetch_v%d", fv), func(t *testing.T) {
			versions := kversion.Stable()
			versions.SetMaxKeyVersion(int16(kmsg.Fetch), fv)
			cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("c"), kgo.MaxVersions(versions),
				kgo.ConsumeTopics("pay", "pay.analytics", "pay.b"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			want := map[string]int{}
			total := 0
			for _, name := range []string{"pay", "pay.analytics", "pay.b"} {
				want[name] = wantNamed(name, at, 0)
				total += want[name]
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			byName := map[string][]refRecord{}
			n := 0
			for n < total && ctx.Err() == nil {
				fs := cl.PollFetches(ctx)
				fs.EachError(func(tp string, p int32, err error) {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("fetch %s[%d]: %v", tp, p, err)
					}
				})
				fs.EachRecord(func(r *kgo.Record) {
					n++
					hs := make([]kmsg.Header, 0, len(r.Headers))
					for _, h := range r.Headers {
						hs = append(hs, kmsg.Header{Key: h.Key, Value: h.Value})
					}
					byName[r.Topic] = append(byName[r.Topic], refRecord{offset: r.Offset, key: fmt.Sprintf("%d", r.Partition), value: r.Value, headers: hs})
				})
			}
			for name, recs := range byName {
				got := 0
				for _, p := range []int32{0, 1} {
					var part []refRecord
					for _, r := range recs {
						if r.key == fmt.Sprint(p) {
							part = append(part, r)
						}
					}
					got += checkNamed(t, name, part, at, p)
				}
				if got != want[name] {
					t.Errorf("%s: %d records, want %d", name, got, want[name])
				}
			}
			if len(byName) != 3 {
				t.Errorf("records came under %d names, want 3", len(byName))
			}
		})
	}
}

// A fetch session forgets one partition of a view topic (a rebalance took
// it away) and keeps the other: the session's later answers still carry
// the kept partition under the view's name, through the view; never the
// real topic's records in clear.
func TestViewSessionForgetsSomePartitions(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:4") // 4 partitions on 3 brokers: two share a leader
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}})
	for _, version := range []int16{12, 17} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			versions := kversion.Stable()
			versions.SetMaxKeyVersion(int16(kmsg.Fetch), version)
			cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("c"), kgo.MaxVersions(versions))
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
			vt := md.Topics["pay.analytics"]
			keep, forget := int32(-1), int32(-1)
			for a := int32(0); a < 4 && keep < 0; a++ {
				for b := a + 1; b < 4; b++ {
					if vt.Partitions[a].Leader == vt.Partitions[b].Leader {
						keep, forget = a, b
						break
					}
				}
			}
			if keep < 0 {
				t.Fatalf("no two partitions share a leader: %+v", vt.Partitions)
			}
			ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "pay.analytics")
			if err != nil {
				t.Fatal(err)
			}
			endOf := map[int32]int64{}
			ends.Each(func(o kadm.ListedOffset) { endOf[o.Partition] = o.Offset })
			fetch := func(sessionID, epoch int32, parts []int32, forget []int32) *kmsg.FetchResponse {
				req := kmsg.NewPtrFetchRequest()
				req.Version, req.ReplicaID, req.MaxWaitMillis, req.MaxBytes = version, -1, 50, 1<<20
				req.SessionID, req.SessionEpoch = sessionID, epoch
				if len(parts) > 0 {
					rt := kmsg.NewFetchRequestTopic()
					rt.Topic, rt.TopicID = "pay.analytics", vt.ID
					for _, p := range parts {
						rp := kmsg.NewFetchRequestTopicPartition()
						rp.Partition, rp.PartitionMaxBytes, rp.LogStartOffset = p, 1<<20, -1
						rp.FetchOffset = endOf[p]
						rt.Partitions = append(rt.Partitions, rp)
					}
					req.Topics = append(req.Topics, rt)
				}
				if len(forget) > 0 {
					ft := kmsg.NewFetchRequestForgottenTopic()
					ft.Topic, ft.TopicID, ft.Partitions = "pay.analytics", vt.ID, forget
					req.ForgottenTopics = append(req.ForgottenTopics, ft)
				}
				resp, err := req.RequestWith(ctx, cl.Broker(int(vt.Partitions[keep].Leader)))
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			first := fetch(0, 0, []int32{keep, forget}, nil)
			if first.SessionID == 0 {
				t.Fatal("no fetch session")
			}
			fetch(first.SessionID, 1, nil, []int32{forget})
			prod, err := kgo.NewClient(kgo.SeedBrokers(upstream...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "pay", Partition: keep, Value: []byte(viewInput(i))}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			prod.Close()
			var got int
			for epoch := int32(2); epoch < 8 && got == 0; epoch++ {
				resp := fetch(first.SessionID, epoch, nil, nil)
				if resp.ErrorCode != 0 {
					t.Fatalf("fetch: %v", kerr.ErrorForCode(resp.ErrorCode))
				}
				for _, rt := range resp.Topics {
					if rt.Topic == "pay" || (version >= 13 && rt.TopicID != vt.ID) {
						t.Fatalf("the session's answer names the real topic (%q %v)", rt.Topic, rt.TopicID)
					}
					for _, p := range rt.Partitions {
						batches, ok := refDecode(p.RecordBatches)
						if !ok {
							t.Fatal("batches do not decode")
						}
						for _, b := range batches {
							for _, r := range b.recs {
								got++
								if strings.Contains(string(r.value), "4111-1111") {
									t.Errorf("a record in clear: %s", r.value)
								}
							}
						}
					}
				}
			}
			if got == 0 {
				t.Errorf("the kept partition's new records never arrived")
			}
		})
	}
}

// ListOffsets, OffsetFetch and OffsetCommit naming pay and its view in one
// request: the offsets are asked once and answered under each name
// (another timestamp under the second name: INVALID_REQUEST, as a broker
// answers a partition named twice); a commit cannot keep two offsets of
// one partition in one group, so the second name's is refused and the
// first name's offset is the one kept.
func TestViewOffsetsOneTopicUnderTwoNames(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}})
	produceDirect(t, upstream, "pay", 0, 10, kgo.NoCompression())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	md, err := kadm.NewClient(cl).Metadata(ctx, "pay", "pay.analytics")
	if err != nil {
		t.Fatal(err)
	}
	leader := cl.Broker(int(md.Topics["pay"].Partitions[0].Leader))

	lo := func(tsPay, tsView int64) map[string]kmsg.ListOffsetsResponseTopicPartition {
		req := kmsg.NewPtrListOffsetsRequest()
		req.ReplicaID = -1
		for i, name := range []string{"pay", "pay.analytics"} {
			rt := kmsg.NewListOffsetsRequestTopic()
			rt.Topic = name
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Timestamp = []int64{tsPay, tsView}[i]
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
		}
		resp, err := req.RequestWith(ctx, leader)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]kmsg.ListOffsetsResponseTopicPartition{}
		for _, rt := range resp.Topics {
			if _, dup := out[rt.Topic]; dup || len(rt.Partitions) != 1 {
				t.Fatalf("ListOffsets answer: %+v", resp.Topics)
			}
			out[rt.Topic] = rt.Partitions[0]
		}
		return out
	}
	same := lo(-1, -1)
	for _, name := range []string{"pay", "pay.analytics"} {
		if p := same[name]; p.ErrorCode != 0 || p.Offset != 10 {
			t.Errorf("ListOffsets latest of %s: %+v", name, p)
		}
	}
	other := lo(-1, -2)
	if len(other) != 2 {
		t.Fatalf("ListOffsets at two timestamps: %+v", other)
	}
	if p, v := other["pay"], other["pay.analytics"]; p.ErrorCode != 0 || p.Offset != 10 || v.ErrorCode != kerr.InvalidRequest.Code {
		t.Errorf("ListOffsets at two timestamps (pay latest, its view earliest): %+v", other)
	}

	creq := kmsg.NewPtrOffsetCommitRequest()
	creq.Group, creq.Generation = "g2", -1
	for name, off := range map[string]int64{"pay": 7, "pay.analytics": 4} {
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic, rt.TopicID = name, md.Topics[name].ID
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Offset = off
		rt.Partitions = append(rt.Partitions, rp)
		creq.Topics = append(creq.Topics, rt)
	}
	kept := creq.Topics[0].Topic
	keptAt := creq.Topics[0].Partitions[0].Offset
	cresp, err := creq.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]int16{}
	for _, rt := range cresp.Topics {
		name := rt.Topic
		if cresp.Version >= 10 {
			for n, mt := range md.Topics {
				if [16]byte(mt.ID) == rt.TopicID {
					name = n
				}
			}
		}
		for _, p := range rt.Partitions {
			codes[name] = p.ErrorCode
		}
	}
	for _, name := range []string{"pay", "pay.analytics"} {
		want := kerr.InvalidTopicException.Code
		if name == kept {
			want = 0
		}
		if c, ok := codes[name]; !ok || c != want {
			t.Errorf("commit under %s: code %d (answered %v), want %d", name, c, ok, want)
		}
	}
	fo, err := kadm.NewClient(cl).FetchOffsetsForTopics(ctx, "g2", "pay", "pay.analytics")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"pay", "pay.analytics"} {
		if o, ok := fo.Lookup(name, 0); !ok || o.At != keptAt {
			t.Errorf("committed offset under %s: %+v, want %d", name, o, keptAt)
		}
	}
}

// A view comes into force (a reload) while a client's fetch session holds
// the topic it masks in place: the session was opened without the view,
// and an incremental fetch that names nothing would carry the topic's new
// records as stored. The first fetch after the change closes the session
// instead, and the client's next, full fetch goes through the view.
func TestViewAddedDuringSession(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "other", topic: "other"}}) // views in force, none for pay
	v12 := kversion.Stable()
	v12.SetMaxKeyVersion(int16(kmsg.Fetch), 12)
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("analyst"), kgo.MaxVersions(v12))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).Metadata(ctx, "pay")
	if err != nil {
		t.Fatal(err)
	}
	leader := cl.Broker(int(md.Topics["pay"].Partitions[0].Leader))
	fetch := func(sessionID, epoch int32, named bool) *kmsg.FetchResponse {
		req := kmsg.NewPtrFetchRequest()
		req.Version, req.ReplicaID, req.MaxWaitMillis, req.MaxBytes = 12, -1, 50, 1<<20
		req.SessionID, req.SessionEpoch = sessionID, epoch
		if named {
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic = "pay"
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.PartitionMaxBytes, rp.LogStartOffset = 1<<20, -1
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
		}
		resp, err := req.RequestWith(ctx, leader)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	clear := func(resp *kmsg.FetchResponse) (n int) {
		for _, rt := range resp.Topics {
			for _, p := range rt.Partitions {
				batches, _ := refDecode(p.RecordBatches)
				for _, b := range batches {
					for _, r := range b.recs {
						n++
						if strings.Contains(string(r.value), "4111-1111") {
							t.Errorf("a record in clear: %s", r.value)
						}
					}
				}
			}
		}
		return n
	}
	first := fetch(0, 0, true)
	if first.SessionID == 0 {
		t.Fatal("no session")
	}
	tp.SetViews(testViews{{name: "pay", topic: "pay", clients: []string{"analyst"}}})
	produceDirect(t, upstream, "pay", 1, 3, kgo.NoCompression())
	next := fetch(first.SessionID, 1, false)
	clear(next)
	if next.SessionID != 0 {
		t.Errorf("the session stayed open (%d) across the view's arrival", next.SessionID)
	}
	if n := clear(fetch(0, 0, true)); n == 0 {
		t.Errorf("the full fetch after got no record")
	}
}
