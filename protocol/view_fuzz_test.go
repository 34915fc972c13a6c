package protocol

import (
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzViewBatchesFrom: batchesFrom never panics and returns a suffix of
// its input; every batch it left out is whole and ends before the offset,
// and the first one it kept (if whole) does not.
func FuzzViewBatchesFrom(f *testing.F) {
	b := append(viewBatchSeed(f, 0, kgo.NoCompression(), "a", "b"), viewBatchSeed(f, 4, kgo.ZstdCompression(), "c", "d")...)
	for _, off := range []int64{-1, 0, 3, 4, 7, 8, 100} {
		f.Add(b, off)
	}
	f.Add(b[:30], int64(5))
	f.Add([]byte{}, int64(0))
	f.Fuzz(func(t *testing.T, in []byte, off int64) {
		out := batchesFrom(in, off)
		if len(out) > len(in) || (len(out) > 0 && &out[len(out)-1] != &in[len(in)-1]) {
			t.Fatalf("not a suffix of the input")
		}
		skipped := in[:len(in)-len(out)]
		for len(skipped) > 0 {
			if len(skipped) < 17 {
				t.Fatalf("left out a partial batch")
			}
			size := int(int32(binary.BigEndian.Uint32(skipped[8:12])))
			if size < 14 || 12+size > len(skipped) {
				t.Fatalf("left out a batch that is not whole")
			}
			last := int64(binary.BigEndian.Uint64(skipped))
			if skipped[16] == 2 {
				last += int64(int32(binary.BigEndian.Uint32(skipped[23:27])))
			}
			if last >= off {
				t.Fatalf("left out a batch ending at %d, not before %d", last, off)
			}
			skipped = skipped[12+size:]
		}
	})
}

// fuzzViewKeys are the requests views rewrite.
var fuzzViewKeys = []kmsg.Key{kmsg.Fetch, kmsg.Metadata, kmsg.ListOffsets, kmsg.OffsetCommit, kmsg.TxnOffsetCommit, kmsg.OffsetFetch,
	kmsg.OffsetForLeaderEpoch, kmsg.DescribeTopicPartitions, kmsg.DescribeConfigs, kmsg.AlterConfigs, kmsg.IncrementalAlterConfigs, kmsg.DeleteTopics,
	kmsg.CreateTopics, kmsg.CreatePartitions, kmsg.DeleteRecords, kmsg.ElectLeaders, kmsg.AlterPartitionAssignments, kmsg.AlterReplicaLogDirs, kmsg.OffsetDelete, kmsg.DescribeProducers, kmsg.AddPartitionsToTxn,
	kmsg.ConsumerGroupHeartbeat, kmsg.ShareGroupHeartbeat, kmsg.ShareFetch, kmsg.ShareAcknowledge}

// FuzzViewRequests: any request of the kinds views rewrite, and any
// answer to it, goes through viewRequest and viewResponse without a panic;
// what they forward decodes at the request's version.
func FuzzViewRequests(f *testing.F) {
	p, err := New(Config{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1", BrokerPortFirst: 30000, BrokerPortCount: 10,
		MaxFrameBytes: 1 << 20, MaxDecodedBytes: 1 << 20, MaxRecordsPerRequest: 1000, MaxDecodedBytesTotal: 4 << 20,
		MaxHeldBytes: 4 << 20, Upstream: []string{"127.0.0.1:1"}, ShutdownGrace: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer: prometheus.NewRegistry()})
	if err != nil {
		f.Fatal(err)
	}
	defer p.bootstrap.Close()
	realID := [16]byte{1, 2, 3}
	p.LearnTopic(realID, "pay")
	vs := Views(testViews{{name: "pay.analytics", topic: "pay"}, {name: "pay.b", topic: "pay"}, {name: "orders", topic: "orders", clients: []string{"test"}}})
	ids := [][16]byte{realID, viewTopicID("pay.analytics"), viewTopicID("pay.b")}
	names := []string{"pay", "pay.analytics", "pay.b", "orders"}

	// Seeds: each kind at its newest version, naming the names above.
	for ki, key := range fuzzViewKeys {
		req := kmsg.RequestForKey(int16(key))
		req.SetVersion(req.MaxVersion())
		switch r := req.(type) {
		case *kmsg.FetchRequest:
			for i, n := range names {
				t := kmsg.NewFetchRequestTopic()
				t.Topic, t.TopicID = n, ids[i%len(ids)]
				t.Partitions = []kmsg.FetchRequestTopicPartition{{Partition: 0, FetchOffset: int64(i)}}
				r.Topics = append(r.Topics, t)
			}
		case *kmsg.ListOffsetsRequest:
			for i, n := range names {
				r.Topics = append(r.Topics, kmsg.ListOffsetsRequestTopic{Topic: n, Partitions: []kmsg.ListOffsetsRequestTopicPartition{{Timestamp: int64(-1 - i%2)}}})
			}
		case *kmsg.DeleteTopicsRequest:
			for i, n := range names {
				r.Topics = append(r.Topics, kmsg.DeleteTopicsRequestTopic{Topic: kmsg.StringPtr(n), TopicID: ids[i%len(ids)]})
			}
		case *kmsg.DescribeConfigsRequest:
			for _, n := range names {
				r.Resources = append(r.Resources, kmsg.DescribeConfigsRequestResource{ResourceType: kmsg.ConfigResourceTypeTopic, ResourceName: n})
			}
		case *kmsg.ConsumerGroupHeartbeatRequest:
			r.Group, r.SubscribedTopicNames = "g", names[1:]
		case *kmsg.ShareGroupHeartbeatRequest:
			r.GroupID, r.SubscribedTopicNames = "g", names
		case *kmsg.ShareFetchRequest:
			for _, id := range ids {
				r.Topics = append(r.Topics, kmsg.ShareFetchRequestTopic{TopicID: id, Partitions: []kmsg.ShareFetchRequestTopicPartition{{}}})
			}
		case *kmsg.DeleteRecordsRequest:
			for _, n := range names {
				r.Topics = append(r.Topics, kmsg.DeleteRecordsRequestTopic{Topic: n, Partitions: []kmsg.DeleteRecordsRequestTopicPartition{{}}})
			}
		}
		resp := req.ResponseKind()
		resp.SetVersion(req.GetVersion())
		if fr, ok := resp.(*kmsg.FetchResponse); ok {
			t := kmsg.NewFetchResponseTopic()
			t.Topic, t.TopicID = "pay", realID
			t.Partitions = []kmsg.FetchResponseTopicPartition{{RecordBatches: viewBatchSeed(f, 0, kgo.NoCompression(), viewInput(1), viewInput(2))}}
			fr.Topics = append(fr.Topics, t)
		}
		f.Add(uint8(ki), req.GetVersion(), req.AppendTo(nil), resp.AppendTo(nil))
	}
	f.Fuzz(func(t *testing.T, ki uint8, version int16, body, respBody []byte) {
		key := fuzzViewKeys[int(ki)%len(fuzzViewKeys)]
		req := kmsg.RequestForKey(int16(key))
		if version < 0 || version > req.MaxVersion() {
			return
		}
		req.SetVersion(version)
		if req.ReadFrom(body) != nil {
			return
		}
		frame := rawRequest(req, 9)
		h, err := ParseRequestHeader(frame[4:])
		if err != nil {
			t.Fatal(err)
		}
		pr := &pair{p: p, done: make(chan struct{})}
		for round := 0; round < 2; round++ { // a second round sees the first's session state
			out, _, vr, err := pr.viewRequest(&vs, h, append([]byte(nil), frame...), 0)
			if err != nil {
				if !errors.Is(err, ErrBadHeader) {
					t.Fatalf("viewRequest: %v", err)
				}
				return
			}
			sent := kmsg.RequestForKey(int16(key))
			sent.SetVersion(version)
			if err := sent.ReadFrom(out[4+h.BodyOffset:]); err != nil {
				t.Fatalf("the forwarded request does not decode: %v", err)
			}
			if vr == nil {
				continue
			}
			resp := req.ResponseKind()
			resp.SetVersion(version)
			if resp.ReadFrom(respBody) != nil {
				resp = req.ResponseKind()
				resp.SetVersion(version)
			}
			rframe := binary.BigEndian.AppendUint32(make([]byte, 4), 9)
			if responseHeaderFlexible(int16(key), version) {
				rframe = append(rframe, 0)
			}
			rframe = resp.AppendTo(rframe)
			binary.BigEndian.PutUint32(rframe, uint32(len(rframe)-4))
			final, err := pr.viewResponse(inflight{key: int16(key), version: version, corr: 9, view: vr}, rframe)
			if err != nil {
				continue // an answer that does not decode at this version
			}
			off, _ := responseBodyOffset(final[4:], int16(key), version)
			got := req.ResponseKind()
			got.SetVersion(version)
			if err := got.ReadFrom(final[4+off:]); err != nil {
				t.Fatalf("the answer to the client does not decode: %v", err)
			}
		}
	})
}
