package protocol

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The requests that would change a topic refuse a virtual one, and never
// reach the broker: the view "shadow" reads pay, and the brokers also hold
// a real topic named shadow (the client cannot see it: the view's name
// wins). Deleting, growing, trimming, reconfiguring shadow through the
// proxy is refused with INVALID_TOPIC_EXCEPTION (creating it:
// TOPIC_ALREADY_EXISTS) and the real shadow and pay stay as they were.
func TestViewDestructiveRequestsRefused(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:2,shadow:2")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "shadow", topic: "pay"}})
	produceDirect(t, upstream, "pay", 0, 10, kgo.NoCompression())
	produceDirect(t, upstream, "shadow", 0, 10, kgo.NoCompression())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	dadm := kadm.NewClient(direct(t, upstream))
	isRefused := func(what string, err error, msg *string) {
		t.Helper()
		if !errors.Is(err, kerr.InvalidTopicException) {
			t.Errorf("%s: %v, want INVALID_TOPIC_EXCEPTION", what, err)
		}
		if msg != nil && !strings.Contains(*msg, "is a view") {
			t.Errorf("%s: message %q", what, *msg)
		}
	}

	del, err := adm.DeleteTopics(ctx, "shadow")
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := del["shadow"]; !ok {
		t.Errorf("DeleteTopics: no answer for shadow: %+v", del)
	} else {
		isRefused("DeleteTopics", d.Err, &d.ErrMessage)
	}
	// By the view's topic id (v6+).
	dreq := kmsg.NewPtrDeleteTopicsRequest()
	dreq.TimeoutMillis = 5000
	dt := kmsg.NewDeleteTopicsRequestTopic()
	dt.TopicID = viewTopicID("shadow")
	dreq.Topics = append(dreq.Topics, dt)
	dresp, err := dreq.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(dresp.Topics) != 1 || dresp.Topics[0].TopicID != viewTopicID("shadow") || dresp.Topics[0].ErrorCode != kerr.InvalidTopicException.Code {
		t.Errorf("DeleteTopics by the view's id: %+v", dresp.Topics)
	}

	cp, err := adm.CreatePartitions(ctx, 2, "shadow")
	if err != nil {
		t.Fatal(err)
	}
	isRefused("CreatePartitions", cp["shadow"].Err, kmsg.StringPtr(cp["shadow"].ErrMessage))

	ct, err := adm.CreateTopic(ctx, 1, 1, nil, "shadow")
	if !errors.Is(ct.Err, kerr.TopicAlreadyExists) {
		t.Errorf("CreateTopics of the view's name: %v %v", ct.Err, err)
	}

	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: "shadow", Partition: 0, At: 5})
	dr, err := adm.DeleteRecords(ctx, os)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := dr.Lookup("shadow", 0); !ok {
		t.Errorf("DeleteRecords: no answer for shadow/0")
	} else {
		isRefused("DeleteRecords", r.Err, nil)
	}

	ac, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "retention.ms", Value: kmsg.StringPtr("1000")}}, "shadow")
	if err != nil {
		t.Fatal(err)
	}
	if len(ac) != 1 {
		t.Fatalf("IncrementalAlterConfigs: %+v", ac)
	}
	isRefused("IncrementalAlterConfigs", ac[0].Err, kmsg.StringPtr(ac[0].ErrMessage))
	acs, err := adm.AlterTopicConfigsState(ctx, []kadm.AlterConfig{{Name: "retention.ms", Value: kmsg.StringPtr("1000")}}, "shadow")
	if err != nil {
		t.Fatal(err)
	}
	if len(acs) != 1 {
		t.Fatalf("AlterConfigs: %+v", acs)
	}
	isRefused("AlterConfigs", acs[0].Err, kmsg.StringPtr(acs[0].ErrMessage))

	// A transactional producer cannot add the view to a transaction.
	areq := kmsg.NewPtrAddPartitionsToTxnRequest()
	areq.Version = 3
	areq.TransactionalID, areq.ProducerID, areq.ProducerEpoch = "tx", 1, 0
	areq.Topics = append(areq.Topics, kmsg.AddPartitionsToTxnRequestTopic{Topic: "shadow", Partitions: []int32{0, 1}})
	aresp, err := areq.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(aresp.Topics) != 1 || aresp.Topics[0].Topic != "shadow" || len(aresp.Topics[0].Partitions) != 2 ||
		aresp.Topics[0].Partitions[0].ErrorCode != kerr.InvalidTopicException.Code {
		t.Errorf("AddPartitionsToTxn: %+v", aresp.Topics)
	}

	// The operators' requests on partitions.
	ereq := kmsg.NewPtrElectLeadersRequest()
	ereq.TimeoutMillis = 5000
	ereq.Topics = []kmsg.ElectLeadersRequestTopic{{Topic: "shadow", Partitions: []int32{0, 1}}}
	eresp, err := ereq.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(eresp.Topics) != 1 || eresp.Topics[0].Topic != "shadow" || len(eresp.Topics[0].Partitions) != 2 {
		t.Errorf("ElectLeaders: %+v", eresp.Topics)
	} else {
		p := eresp.Topics[0].Partitions[0]
		isRefused("ElectLeaders", kerr.ErrorForCode(p.ErrorCode), p.ErrorMessage)
	}
	rreq := kmsg.NewPtrAlterPartitionAssignmentsRequest()
	rreq.TimeoutMillis = 5000
	rreq.Topics = []kmsg.AlterPartitionAssignmentsRequestTopic{{Topic: "shadow", Partitions: []kmsg.AlterPartitionAssignmentsRequestTopicPartition{{Partition: 0, Replicas: []int32{0}}}}}
	rresp, err := rreq.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(rresp.Topics) != 1 || rresp.Topics[0].Topic != "shadow" || len(rresp.Topics[0].Partitions) != 1 {
		t.Errorf("AlterPartitionAssignments: %+v", rresp.Topics)
	} else {
		p := rresp.Topics[0].Partitions[0]
		isRefused("AlterPartitionAssignments", kerr.ErrorForCode(p.ErrorCode), p.ErrorMessage)
	}
	lreq := kmsg.NewPtrAlterReplicaLogDirsRequest()
	lreq.Dirs = []kmsg.AlterReplicaLogDirsRequestDir{{Dir: "/tmp/x", Topics: []kmsg.AlterReplicaLogDirsRequestDirTopic{{Topic: "shadow", Partitions: []int32{1}}}}}
	lresp, err := lreq.RequestWith(ctx, cl.Broker(0))
	if err != nil {
		t.Fatal(err)
	}
	if len(lresp.Topics) != 1 || lresp.Topics[0].Topic != "shadow" || len(lresp.Topics[0].Partitions) != 1 {
		t.Errorf("AlterReplicaLogDirs: %+v", lresp.Topics)
	} else {
		isRefused("AlterReplicaLogDirs", kerr.ErrorForCode(lresp.Topics[0].Partitions[0].ErrorCode), nil)
	}

	// Nothing happened to the real topics.
	md, err := dadm.Metadata(ctx, "shadow", "pay")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"shadow", "pay"} {
		if mt, ok := md.Topics[name]; !ok || mt.Err != nil || len(mt.Partitions) != 2 {
			t.Errorf("%s at the brokers: %+v", name, md.Topics[name])
		}
	}
	starts, err := dadm.ListStartOffsets(ctx, "shadow", "pay")
	if err != nil {
		t.Fatal(err)
	}
	starts.Each(func(o kadm.ListedOffset) {
		if o.Offset != 0 {
			t.Errorf("%s/%d starts at %d: records were deleted", o.Topic, o.Partition, o.Offset)
		}
	})
	cfg, err := dadm.DescribeTopicConfigs(ctx, "shadow")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg[0].Configs {
		if c.Key == "retention.ms" && c.Value != nil && *c.Value == "1000" {
			t.Errorf("the real shadow's retention.ms was altered")
		}
	}
	if v := metricValue(t, tp.vm.refused.WithLabelValues("DeleteTopics")); v != 2 {
		t.Errorf("refused{DeleteTopics} = %v, want 2", v)
	}
	if !strings.Contains(tp.logs.String(), "refused a request naming a view") {
		t.Errorf("no log line for the refusals")
	}
}

// Read-only requests answer for a virtual topic from the real one:
// DescribeConfigs and DescribeProducers under the view's name (and the
// real topic's too when both are asked); OffsetDelete deletes the group's
// offsets of the view.
func TestViewReadOnlyAdminRequests(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:2")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}})
	produceDirect(t, upstream, "pay", 0, 10, kgo.NoCompression())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	rcs, err := adm.DescribeTopicConfigs(ctx, "pay.analytics", "pay")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, rc := range rcs {
		if rc.Err != nil {
			t.Errorf("DescribeConfigs %s: %v", rc.Name, rc.Err)
		}
		got[rc.Name] = len(rc.Configs)
	}
	if got["pay.analytics"] == 0 || got["pay.analytics"] != got["pay"] {
		t.Errorf("DescribeConfigs: configs by name %v, want the real topic's for the view", got)
	}

	dtp := kmsg.NewPtrDescribeTopicPartitionsRequest()
	dtp.ResponsePartitionLimit = 100
	for _, n := range []string{"pay.analytics", "pay"} {
		dtp.Topics = append(dtp.Topics, kmsg.DescribeTopicPartitionsRequestTopic{Topic: n})
	}
	dtpResp, err := dtp.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	described := map[string]kmsg.DescribeTopicPartitionsResponseTopic{}
	for _, rt := range dtpResp.Topics {
		if rt.Topic != nil {
			described[*rt.Topic] = rt
		}
	}
	if v, r := described["pay.analytics"], described["pay"]; v.ErrorCode != 0 || len(v.Partitions) != 2 || v.TopicID != viewTopicID("pay.analytics") ||
		r.ErrorCode != 0 || len(r.Partitions) != 2 || r.TopicID == v.TopicID {
		t.Errorf("DescribeTopicPartitions: %+v", dtpResp.Topics)
	}

	dp, err := adm.DescribeProducers(ctx, kadm.TopicsSet{"pay.analytics": {0: {}, 1: {}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := dp["pay.analytics"]; !ok || len(dp["pay.analytics"].Partitions) != 2 {
		t.Errorf("DescribeProducers: %+v", dp)
	}
	ddp, err := kadm.NewClient(direct(t, upstream)).DescribeProducers(ctx, kadm.TopicsSet{"pay": {0: {}, 1: {}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range dp["pay.analytics"].Partitions {
		want := ddp["pay"].Partitions[p.Partition]
		if p.Err != nil || len(p.ActiveProducers) != len(want.ActiveProducers) || p.Topic != "pay.analytics" {
			t.Errorf("DescribeProducers pay.analytics/%d: %v, %d producers, want pay's %d", p.Partition, p.Err, len(p.ActiveProducers), len(want.ActiveProducers))
		}
	}

	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: "pay.analytics", Partition: 0, At: 3, LeaderEpoch: -1})
	cr, err := adm.CommitOffsets(ctx, "g-del", os)
	if err != nil || cr.Error() != nil {
		t.Fatal(err, cr.Error())
	}
	fo, err := adm.FetchOffsetsForTopics(ctx, "g-del", "pay.analytics")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := fo.Lookup("pay.analytics", 0); !ok || o.At != 3 {
		t.Fatalf("committed offset of the view: %+v %v", o, ok)
	}
	dor, err := adm.DeleteOffsets(ctx, "g-del", kadm.TopicsSet{"pay.analytics": {0: {}}})
	if err != nil {
		t.Fatal(err)
	}
	if err, ok := dor.Lookup("pay.analytics", 0); !ok || err != nil {
		t.Errorf("OffsetDelete of the view: %v (answered: %v)", err, ok)
	}
	fo, err = adm.FetchOffsetsForTopics(ctx, "g-del", "pay.analytics")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := fo.Lookup("pay.analytics", 0); ok && o.At >= 0 {
		t.Errorf("the view's offset is still committed: %+v", o)
	}
}

// direct is a client of the brokers themselves, closed with the test.
func direct(t *testing.T, upstream []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(upstream...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// A KIP-848 consumer group (franz-go's ServerSideBalancer) consumes a
// virtual topic: the subscription goes to the real topic, the assignment
// comes back under the view's topic id, and the records through the view;
// the group commits and a new member resumes. A member subscribing to a
// topic and its view is refused with a message.
func TestViewKIP848Group(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:2")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay.analytics", topic: "pay"}})
	at := produceDirect(t, upstream, "pay", 0, 40, kgo.NoCompression())
	want := 0
	for _, i := range at {
		if _, kept, _ := viewExpect(i); kept {
			want++
		}
	}
	got := consumeView(t, tp.Addr(), "c", "g848", "pay.analytics", want, kgo.ServerSideBalancer())
	checkViewRecords(t, got, at, "pay.analytics", 0)
	more := produceDirect(t, upstream, "pay", 1000, 20, kgo.NoCompression())
	want2 := 0
	for _, i := range more {
		if _, kept, _ := viewExpect(i); kept {
			want2++
		}
	}
	got2 := consumeView(t, tp.Addr(), "c", "g848", "pay.analytics", want2, kgo.ServerSideBalancer())
	checkViewRecords(t, got2, more, "pay.analytics", 1000)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).Metadata(ctx, "pay", "pay.analytics"); err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Version = 1
	req.Group, req.MemberID, req.MemberEpoch, req.RebalanceTimeoutMillis = "g-both", "m-0123456789abcdef0123", 0, 5000
	req.SubscribedTopicNames = []string{"pay", "pay.analytics"}
	req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ErrorCode != kerr.InvalidRequest.Code || resp.ErrorMessage == nil || !strings.Contains(*resp.ErrorMessage, "read one topic") {
		t.Errorf("a member subscribing to pay and its view: %v %v", kerr.ErrorForCode(resp.ErrorCode), resp.ErrorMessage)
	}
}

// Share groups (KIP-932) cannot read a view: a franz-go share consumer of
// the in-place view gets no record in clear (its heartbeat is refused), and
// a ShareFetch naming the topic is answered INVALID_TOPIC_EXCEPTION for its
// partitions without the records.
func TestViewShareGroupRefused(t *testing.T) {
	upstream := startKfake(t, "-topics", "pay:1")
	tp := startProxy(t, upstream, nil)
	tp.SetViews(testViews{{name: "pay", topic: "pay", clients: []string{"analyst"}}})
	// A share group starts at the end of the log: records are produced
	// once its consumers had time to join.
	produceLater := func() {
		time.AfterFunc(1500*time.Millisecond, func() { produceDirect(t, upstream, "pay", 0, 10, kgo.NoCompression()) })
	}
	// Share groups work through the proxy for a client the view does not
	// name: it gets the originals.
	other, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("someone"), kgo.ShareGroup("sg-other"),
		kgo.ConsumeTopics("pay"), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	produceLater()
	octx, ocancel := context.WithTimeout(context.Background(), 10*time.Second)
	n := 0
	for n < 10 && octx.Err() == nil {
		n += len(other.PollFetches(octx).Records())
	}
	ocancel()
	other.Close()
	if n != 10 {
		t.Fatalf("a share consumer the view does not name got %d records, want 10", n)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("analyst"), kgo.ShareGroup("sg"),
		kgo.ConsumeTopics("pay"), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produceLater()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var sawErr error
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			t.Errorf("a share consumer of the view got a record: %s", r.Value)
		})
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				sawErr = err
			}
		})
	}
	if v := metricValue(t, tp.vm.refused.WithLabelValues("ShareGroupHeartbeat")); v == 0 {
		t.Errorf("the share group's heartbeat was not refused (error seen: %v)", sawErr)
	}

	// A raw ShareFetch by the real topic's id.
	raw, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ClientID("analyst"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	md, err := kadm.NewClient(raw).Metadata(ctx2, "pay")
	if err != nil {
		t.Fatal(err)
	}
	sreq := kmsg.NewPtrShareFetchRequest()
	sreq.GroupID, sreq.MemberID, sreq.ShareSessionEpoch = kmsg.StringPtr("sg2"), kmsg.StringPtr("m-0123456789abcdef0123"), 0
	sreq.MaxWaitMillis, sreq.MaxBytes, sreq.MaxRecords, sreq.BatchSize = 10, 1<<20, 100, 100
	st := kmsg.NewShareFetchRequestTopic()
	st.TopicID = md.Topics["pay"].ID
	st.Partitions = append(st.Partitions, kmsg.NewShareFetchRequestTopicPartition())
	sreq.Topics = append(sreq.Topics, st)
	sresp, err := sreq.RequestWith(ctx2, raw.Broker(int(md.Topics["pay"].Partitions[0].Leader)))
	if err != nil {
		t.Fatal(err)
	}
	if len(sresp.Topics) != 1 || len(sresp.Topics[0].Partitions) != 1 {
		t.Fatalf("ShareFetch: %v %+v", kerr.ErrorForCode(sresp.ErrorCode), sresp.Topics)
	}
	for _, rt := range sresp.Topics {
		if rt.TopicID != md.Topics["pay"].ID {
			t.Errorf("ShareFetch answer names %v", rt.TopicID)
		}
		for _, p := range rt.Partitions {
			if p.ErrorCode != kerr.InvalidTopicException.Code || len(p.Records) != 0 {
				t.Errorf("ShareFetch of the view: %v, %d bytes of records", kerr.ErrorForCode(p.ErrorCode), len(p.Records))
			}
		}
	}
}
