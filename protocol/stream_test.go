package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// randomFetch builds a v16+ Fetch response with random topics,
// partitions, aborted transactions, record bytes, partition tags and node
// endpoints whose hosts are of random length.
func randomFetch(rng *rand.Rand, v int16) *kmsg.FetchResponse {
	r := kmsg.NewPtrFetchResponse()
	r.SetVersion(v)
	r.ThrottleMillis, r.SessionID = rng.Int31n(100), rng.Int31()
	for range rng.Intn(4) {
		t := kmsg.NewFetchResponseTopic()
		rng.Read(t.TopicID[:])
		for range rng.Intn(4) {
			p := kmsg.NewFetchResponseTopicPartition()
			p.Partition, p.HighWatermark = rng.Int31n(50), rng.Int63n(1e9)
			for range rng.Intn(3) {
				a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
				a.ProducerID, a.FirstOffset = rng.Int63(), rng.Int63()
				p.AbortedTransactions = append(p.AbortedTransactions, a)
			}
			if rng.Intn(3) > 0 {
				p.RecordBatches = make([]byte, rng.Intn(200<<10))
				rng.Read(p.RecordBatches)
			}
			if rng.Intn(3) == 0 {
				p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = rng.Int31n(9), rng.Int31n(9)
			}
			t.Partitions = append(t.Partitions, p)
		}
		r.Topics = append(r.Topics, t)
	}
	for i := range rng.Intn(4) {
		b := kmsg.NewFetchResponseBroker()
		b.NodeID = int32(i + rng.Intn(3)*10)
		b.Host = strings.Repeat("k", rng.Intn(40))
		b.Port = rng.Int31n(65535)
		if rng.Intn(2) == 0 {
			b.Rack = kmsg.StringPtr("rack-" + strings.Repeat("r", rng.Intn(5)))
		}
		r.Brokers = append(r.Brokers, b)
	}
	return r
}

// TestStreamFetchMatchesTheFullRewrite runs random v16+ Fetch responses
// through the streaming path, cut at random points between what was read
// first and what comes after: the frame keeps its length, and a client
// decodes exactly the response the full rewrite gives (the padding is an
// unknown tag it skips). Where a host cannot be replaced at the same
// length, streaming refuses with errStreamLength (the proxy holds such
// responses instead: streamable).
func TestStreamFetchMatchesTheFullRewrite(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	streamed, refused, totalPadded := 0, 0, 0
	for i := range 400 {
		v := int16(16 + rng.Intn(3))
		in := randomFetch(rng, v)
		body := in.AppendTo(nil)
		frame := binary.BigEndian.AppendUint32(nil, uint32(4+1+len(body)))
		frame = binary.BigEndian.AppendUint32(frame, uint32(i))
		frame = append(frame, 0) // response header tags
		frame = append(frame, body...)
		cut := min(len(frame), 4+4+1+rng.Intn(len(frame)))
		head, rest := frame[:cut], frame[cut:]

		var out bytes.Buffer
		padded, err := streamFetch(&out, bytes.NewReader(rest), head, len(rest), newFakeMapper())
		fits := true
		for _, b := range in.Brokers {
			fits = fits && hostFits(b.Host, "proxy.local")
		}
		if !fits {
			if !errors.Is(err, errStreamLength) {
				t.Fatalf("case %d: a host that cannot be replaced in place: %v, want errStreamLength", i, err)
			}
			refused++
			continue
		}
		if err != nil {
			t.Fatalf("case %d (v%d, %d endpoints): %v", i, v, len(in.Brokers), err)
		}
		streamed++
		if out.Len() != len(frame) || !bytes.Equal(out.Bytes()[:9], frame[:9]) {
			t.Fatalf("case %d: %d bytes out of %d, or the size and header changed", i, out.Len(), len(frame))
		}
		got := kmsg.NewPtrFetchResponse()
		got.SetVersion(v)
		if err := got.ReadFrom(out.Bytes()[9:]); err != nil {
			t.Fatalf("case %d: the streamed response does not decode: %v", i, err)
		}
		withPad := 0
		for j := range got.Brokers {
			if got.Brokers[j].UnknownTags.Len() > 0 {
				withPad++
			}
			got.Brokers[j].UnknownTags = kmsg.Tags{} // the padding
		}
		if padded != withPad {
			t.Fatalf("case %d: streamFetch reports %d padded endpoints, the client sees %d", i, padded, withPad)
		}
		totalPadded += padded
		want, changed, err := rewriteFetch(newFakeMapper(), v, body, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !changed {
			want = body
		}
		if g := got.AppendTo(nil); !bytes.Equal(g, want) {
			t.Fatalf("case %d (v%d): the streamed response differs from the full rewrite", i, v)
		}
	}
	if streamed < 100 || refused < 20 || totalPadded < 50 {
		t.Fatalf("weak cases: %d streamed, %d refused, %d endpoints padded", streamed, refused, totalPadded)
	}
	t.Logf("%d streamed, %d refused, %d endpoints padded", streamed, refused, totalPadded)
}

// TestPadding: every difference of 0 or at least 2 bytes has a padding of
// exactly that length, up to any host length.
func TestPadding(t *testing.T) {
	for d := -3; d < 600; d++ {
		b, _, ok := padding(d)
		if want := d == 0 || d >= 2; ok != want {
			t.Fatalf("padding(%d): ok %v, want %v", d, ok, want)
		}
		if ok && len(b) != d {
			t.Fatalf("padding(%d) is %d bytes", d, len(b))
		}
	}
}

// FuzzStreamFetch: any bytes, cut anywhere, either stream at exactly their
// length or fail; nothing panics or reads past the frame.
func FuzzStreamFetch(f *testing.F) {
	rng := rand.New(rand.NewSource(3))
	for range 8 {
		r := randomFetch(rng, 16)
		for j := range r.Topics {
			for k := range r.Topics[j].Partitions {
				r.Topics[j].Partitions[k].RecordBatches = r.Topics[j].Partitions[k].RecordBatches[:min(len(r.Topics[j].Partitions[k].RecordBatches), 64)]
			}
		}
		f.Add(append([]byte{0, 0, 0, 7, 0}, r.AppendTo(nil)...), uint16(rng.Intn(64)))
	}
	f.Fuzz(func(t *testing.T, payload []byte, cut uint16) {
		frame := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
		frame = append(frame, payload...)
		at := min(len(frame), 4+int(cut))
		var out bytes.Buffer
		_, err := streamFetch(&out, bytes.NewReader(frame[at:]), frame[:at], len(frame)-at, newFakeMapper())
		if err == nil && out.Len() != len(frame) {
			t.Fatalf("streamed %d bytes of a %d-byte frame", out.Len(), len(frame))
		}
	})
}
