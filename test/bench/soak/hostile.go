package main

// The hostile client (issue 25): every -hostile-every, one bounded round
// of what a hostile or broken client sends, beside the load and the other
// faults. A guard file on soak.hostile is loaded for the whole soak, so
// every Produce request (the load's too) is read whole by the proxy, as
// in the findings. A round:
//
//   - compressed bombs: two zstd Produce requests of a few kilobytes that
//     hold 5 million tiny records, one whose batch header says so and one
//     whose header claims 100 (streamed, so the frame does not declare its
//     size): each must be refused with MESSAGE_TOO_LARGE and a short
//     answer;
//   - slow announces: four connections announce 64 MiB Produce requests
//     and send 5 KB of them, held for -hostile-hold; meanwhile a small
//     guarded produce must be answered within 5 s;
//   - malformed frames: a negative size, a size over max_frame_bytes, a
//     header that does not parse, a TLS ClientHello, a frame cut short,
//     random bytes; each connection must be closed by the proxy, which
//     stays up;
//   - idle connections are the connection bursts (-conns-every).
//
// What the proxy answered wrongly is a FINDING; the counts are in the
// report. The load's records must all still arrive (the soak's verdict),
// and RSS stay under -rss-bound.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rtproxy/rtproxy/internal/benchkit"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

const hostileTopic = "soak.hostile"

// hostileGuard is the guard file on hostileTopic.
const hostileGuard = `guard: soak-hostile
topic: soak.hostile
checks:
  - check: value.amount > 0
    message: amount must be positive
    name: positive
`

// hostileBombs are built once: a honest and a lying header.
var hostileBombs [2]*kmsg.ProduceRequest

func buildBombs() {
	hostileBombs[0] = benchkit.TinyRecordsBomb(hostileTopic, 5_000_000, 0)
	hostileBombs[1] = benchkit.TinyRecordsBomb(hostileTopic, 5_000_000, 100)
}

// hostileRound is one round of the hostile client.
func (s *soak) hostileRound() {
	at := since()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(int16(kmsg.Produce), 12) // topics by name
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.bootstrap), kgo.MaxVersions(vs), kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		logf("hostile: client: %v", err)
		return
	}
	defer cl.Close()
	var notes []string

	// Compressed bombs.
	for i, bomb := range hostileBombs {
		resp, err := bomb.RequestWith(ctx, cl)
		if err != nil {
			logf("hostile: bomb %d: %v (the proxy or brokers may be restarting)", i, err)
			s.count("hostile bombs unanswered")
			continue
		}
		p := resp.Topics[0].Partitions[0]
		if p.ErrorCode == kerr.MessageTooLarge.Code && len(resp.AppendTo(nil)) < 4096 {
			s.count("hostile bombs refused (MESSAGE_TOO_LARGE)")
			continue
		}
		if p.ErrorCode == kerr.NotLeaderForPartition.Code || p.ErrorCode == kerr.UnknownTopicOrPartition.Code {
			s.count("hostile bombs unanswered")
			continue
		}
		logf("FINDING: hostile: bomb %d answered %v (%d bytes, message %v)", i, kerr.ErrorForCode(p.ErrorCode), len(resp.AppendTo(nil)), p.ErrorMessage)
		s.count("hostile bombs answered wrongly")
	}
	notes = append(notes, "bombs")

	// Slow announces, and a small guarded produce beside them.
	var slow []net.Conn
	for range 4 {
		c, err := net.DialTimeout("tcp", s.leaderOf(ctx, cl), 2*time.Second)
		if err != nil {
			continue
		}
		frame := announceFrame(64 << 20)
		if _, err := c.Write(frame[:5<<10]); err != nil {
			c.Close()
			continue
		}
		slow = append(slow, c)
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	err = cl.ProduceSync(pctx, &kgo.Record{Topic: hostileTopic, Value: []byte(`{"amount":1}`)}).FirstErr()
	pcancel()
	took := time.Since(start)
	switch {
	case err == nil && took <= 5*time.Second:
		s.count("hostile slow-announce rounds, produce beside them answered")
	case err == nil:
		logf("FINDING: hostile: a small produce beside 4 slow announces took %v", took.Round(time.Millisecond))
		s.count("hostile slow-announce rounds, produce beside them slow")
	default:
		logf("hostile: produce beside slow announces: %v after %v (the proxy or brokers may be restarting)", err, took.Round(time.Millisecond))
		s.count("hostile slow-announce rounds, produce beside them failed")
	}
	time.Sleep(max(0, *hostileHold-time.Since(start)))
	for _, c := range slow {
		c.Close()
	}
	notes = append(notes, fmt.Sprintf("%d slow announces", len(slow)))

	// Malformed frames: each connection must be closed by the proxy.
	closed, open := 0, 0
	for _, payload := range malformedFrames() {
		c, err := net.DialTimeout("tcp", s.bootstrap, 2*time.Second)
		if err != nil {
			continue
		}
		c.Write(payload)
		if w, ok := c.(*net.TCPConn); ok && len(payload) > 0 && payload[0] == 0 && len(payload) < 64 {
			w.CloseWrite() // the cut-short frame: the client goes away mid-frame
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			open++
		} else {
			closed++
		}
		c.Close()
	}
	s.add("hostile malformed frames, connection closed by the proxy", int64(closed))
	if open > 0 {
		logf("FINDING: hostile: %d connections with malformed frames left open for 5 s", open)
		s.add("hostile malformed frames, connection left open", int64(open))
	}
	notes = append(notes, fmt.Sprintf("%d malformed frames", closed+open))
	s.count("hostile rounds")
	if *verbose {
		logf("hostile: round done in %v: %v", (since() - at).Round(time.Millisecond), notes)
	}
}

// leaderOf returns the proxy address of the leader of hostileTopic's
// partition 0 (a Produce elsewhere is refused before it is read whole).
func (s *soak) leaderOf(ctx context.Context, cl *kgo.Client) string {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	t := hostileTopic
	rt.Topic = &t
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Topics) == 0 || len(resp.Topics[0].Partitions) == 0 {
		return s.bootstrap
	}
	leader := resp.Topics[0].Partitions[0].Leader
	for _, b := range resp.Brokers {
		if b.NodeID == leader {
			return net.JoinHostPort(b.Host, fmt.Sprint(b.Port))
		}
	}
	return s.bootstrap
}

// announceFrame is a Produce v7 frame to hostileTopic whose records are n
// zero bytes.
func announceFrame(n int) []byte {
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(7)
	req.Acks, req.TimeoutMillis = -1, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = hostileTopic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = make([]byte, n)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return frameOf(req, 1)
}

func frameOf(req kmsg.Request, corr int32) []byte {
	body := req.AppendTo(nil)
	b := make([]byte, 4, 4+10+len(body))
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = binary.BigEndian.AppendUint16(b, 0xffff) // null client id
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = append(b, body...)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// malformedFrames are the first bytes of connections that must be closed.
func malformedFrames() [][]byte {
	junk := make([]byte, 4096)
	rand.Read(junk)
	junk[0] = 0xff // a negative API key: never forwarded
	return [][]byte{
		{0xff, 0xff, 0xff, 0xf0},                               // a negative size
		{0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0},                   // over max_frame_bytes
		{0, 0, 0, 8, 0x7f, 0x00, 0, 0, 0, 0, 0, 1},             // an unknown API key, header cut
		{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc}, // a TLS ClientHello
		{0, 0, 0x10, 0, 0, 0, 0, 7, 0, 0, 0, 1},                // 4 KiB announced, 8 sent, then EOF
		append([]byte{0, 0, 0x0f, 0xf0}, junk[:4080]...),       // 4080 random bytes as a request
	}
}
