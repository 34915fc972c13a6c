package protocol

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// The pass-through path's allocations per request, asserted (not timed):
// a request the proxy neither guards, taps nor rewrites costs it no heap
// allocation of its own beyond the few its loops make per frame. A
// regression that adds work per request (a copy, a closure, a metric
// label looked up by name) shows here as a count, whatever the machine's
// load.
//
// The client side is raw bytes on a socket (preencoded requests, responses
// read into one buffer), and kfake is a process of its own, so what
// testing.AllocsPerRun counts is the proxy's.
//
// Each is measured 0 today; the bounds leave 1 for a pool refilled after
// a GC. The least of three measurements counts, so that the proxy's own
// background work (a metadata refresh) landing in one does not fail it.
const (
	maxProduceAllocs       = 1 // Produce v11, 1 KiB record, acks=-1
	maxFetchHeldAllocs     = 1 // Fetch v16, response under 64 KiB (held, walked for endpoints)
	maxFetchStreamedAllocs = 1 // Fetch v16, response over 64 KiB (streamed, records spliced); 8 before the pooled streamState
)

func TestPassThroughAllocsPerRequest(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items on purpose: allocation counts do not hold")
	}
	upstream := startKfake(t, "-topics", "allocs:1")
	tp := startProxy(t, upstream, nil)

	// Partition 0's leader and the topic id, through the proxy.
	boot, err := net.Dial("tcp", tp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer boot.Close()
	md := kmsg.NewPtrMetadataRequest()
	md.SetVersion(12)
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr("allocs")
	md.Topics = append(md.Topics, mt)
	boot.Write(rawRequest(md, 1))
	_, payload := readResponse(t, boot)
	var mr kmsg.MetadataResponse
	mr.SetVersion(12)
	if err := mr.ReadFrom(payload[5:]); err != nil { // corr id + header tags
		t.Fatal(err)
	}
	topicID := mr.Topics[0].TopicID
	var addr string
	for _, b := range mr.Brokers {
		if b.NodeID == mr.Topics[0].Partitions[0].Leader {
			addr = net.JoinHostPort(b.Host, fmt.Sprint(b.Port))
		}
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))

	value := make([]byte, 1024)
	for i := range value {
		value[i] = byte(i * 7)
	}
	pr := kmsg.NewPtrProduceRequest()
	pr.SetVersion(11)
	pr.Acks = -1
	pr.TimeoutMillis = 5000
	prt := kmsg.NewProduceRequestTopic()
	prt.Topic = "allocs"
	prp := kmsg.NewProduceRequestTopicPartition()
	prp.Records = recordBatch(string(value))
	prt.Partitions = append(prt.Partitions, prp)
	pr.Topics = append(pr.Topics, prt)
	produce := rawRequest(pr, 7)

	fetch := func(maxBytes int32) []byte {
		fr := kmsg.NewPtrFetchRequest()
		fr.SetVersion(16)
		fr.ReplicaID = -1
		fr.MaxWaitMillis = 0
		fr.MaxBytes = maxBytes
		ft := kmsg.NewFetchRequestTopic()
		ft.TopicID = topicID
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.PartitionMaxBytes = maxBytes
		fp.CurrentLeaderEpoch = -1
		ft.Partitions = append(ft.Partitions, fp)
		fr.Topics = append(fr.Topics, ft)
		return rawRequest(fr, 8)
	}
	buf := make([]byte, 4<<20)
	// roundTrip writes one request and reads its response whole into buf:
	// nothing here allocates.
	roundTrip := func(req []byte) int {
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf[:4]); err != nil {
			t.Fatal(err)
		}
		n := int(binary.BigEndian.Uint32(buf))
		if _, err := io.ReadFull(c, buf[4:4+n]); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Enough records for a streamed fetch (over 64 KiB), and a check
	// that the produce succeeds.
	for range 300 {
		roundTrip(produce)
	}
	var resp kmsg.ProduceResponse
	resp.SetVersion(11)
	if err := resp.ReadFrom(buf[9 : 4+binary.BigEndian.Uint32(buf)]); err != nil {
		t.Fatal(err)
	}
	if ec := resp.Topics[0].Partitions[0].ErrorCode; ec != 0 {
		t.Fatalf("produce: error code %d", ec)
	}

	small, large := fetch(16<<10), fetch(256<<10)
	if n := roundTrip(small); n >= streamAbove {
		t.Fatalf("the small fetch's response is %d bytes, want under %d", n, streamAbove)
	}
	if n := roundTrip(large); n <= streamAbove {
		t.Fatalf("the large fetch's response is %d bytes, want over %d", n, streamAbove)
	}
	for _, c := range []struct {
		name string
		req  []byte
		max  float64
	}{
		{"produce", produce, maxProduceAllocs},
		{"fetch held", small, maxFetchHeldAllocs},
		{"fetch streamed", large, maxFetchStreamedAllocs},
	} {
		got := testing.AllocsPerRun(200, func() { roundTrip(c.req) })
		for range 2 {
			got = min(got, testing.AllocsPerRun(200, func() { roundTrip(c.req) }))
		}
		t.Logf("%s: %.1f allocations per request", c.name, got)
		if got > c.max {
			t.Errorf("%s: %.1f allocations per request, want <= %.0f", c.name, got, c.max)
		}
	}
}
