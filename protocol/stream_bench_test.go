package protocol

import (
	"encoding/binary"
	"math/rand"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// processCPU is the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFetchResponse moves 1 MiB Fetch v16 responses (8 partitions of
// 128 KiB batches, without and with node endpoints) between two loopback
// TCP connections, as the proxy's broker loop does: held whole then
// rewritten if needed (the path before streaming), or streamed with the
// endpoints rewritten in place. Compare the two in one run:
//
//	go test -run '^$' -bench BenchmarkFetchResponse -benchmem ./protocol
func BenchmarkFetchResponse(b *testing.B) {
	rng := rand.New(rand.NewSource(1))
	r := kmsg.NewPtrFetchResponse()
	r.SetVersion(16)
	t := kmsg.NewFetchResponseTopic()
	for i := range 8 {
		p := kmsg.NewFetchResponseTopicPartition()
		p.Partition = int32(i)
		p.RecordBatches = make([]byte, 128<<10)
		rng.Read(p.RecordBatches)
		t.Partitions = append(t.Partitions, p)
	}
	r.Topics = append(r.Topics, t)
	frameOf := func(r *kmsg.FetchResponse) []byte {
		body := r.AppendTo(nil)
		frame := binary.BigEndian.AppendUint32(nil, uint32(4+1+len(body)))
		frame = binary.BigEndian.AppendUint32(frame, 7)
		frame = append(frame, 0)
		return append(frame, body...)
	}
	plain := frameOf(r) // the common case: no leader moved
	br := kmsg.NewFetchResponseBroker()
	br.NodeID, br.Host, br.Port = 1, "kafka-1.kafka-headless.svc", 9092
	r.Brokers = append(r.Brokers, br)
	withEndpoints := frameOf(r)

	pair := func(b *testing.B) (net.Conn, net.Conn) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() { c, _ := ln.Accept(); accepted <- c }()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		return c, <-accepted
	}
	for _, c := range []struct {
		mode, endpoints string
		frame           []byte
	}{{"held", "none", plain}, {"streamed", "none", plain}, {"streamed-nocork", "none", plain}, {"streamed-copy", "none", plain},
		{"held", "one", withEndpoints}, {"streamed", "one", withEndpoints}, {"streamed-nocork", "one", withEndpoints}, {"streamed-copy", "one", withEndpoints}} {
		mode, frame := c.mode, c.frame
		b.Run(mode+"/endpoints="+c.endpoints, func(b *testing.B) {
			spliceRecords = mode != "streamed-copy"
			corkStreamed = mode != "streamed-nocork"
			defer func() { spliceRecords, corkStreamed = true, true }()
			upW, upR := pair(b) // broker → proxy
			clW, clR := pair(b) // proxy → client
			defer func() { upW.Close(); upR.Close(); clW.Close(); clR.Close() }()
			go func() {
				for range b.N {
					if _, err := upW.Write(frame); err != nil {
						return
					}
				}
			}()
			done := make(chan struct{})
			var reads int
			go func() {
				// As a client reads: whatever has arrived, into a
				// 64 KiB buffer, until clW closes. reads/op is how
				// often it was woken with something to read.
				buf := make([]byte, 64<<10)
				for {
					if _, err := clR.Read(buf); err != nil {
						break
					}
					reads++
				}
				close(done)
			}()
			m := newFakeMapper()
			var size [4]byte
			// As the pair reads and corks: through a connReader, with
			// the client socket's RawConn kept.
			ur := newConnReader(upR)
			var clRaw syscall.RawConn
			if corkStreamed {
				clRaw, _ = clW.(*net.TCPConn).SyscallConn()
			}
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for range b.N {
				head, rest, err := readFrameHead(ur, &size, 1<<30, false)
				if err != nil {
					b.Fatal(err)
				}
				if mode != "held" {
					if _, err := streamFetchTo(clW, clRaw, ur, head, rest, m); err != nil {
						b.Fatal(err)
					}
					ReleaseFrame(head)
					continue
				}
				full, err := completeFrame(ur, head, rest)
				if err != nil {
					b.Fatal(err)
				}
				out, changed, err := rewriteFetch(m, 16, full[9:], full[:9:9])
				if err != nil {
					b.Fatal(err)
				}
				if changed {
					binary.BigEndian.PutUint32(out, uint32(len(out)-4))
				} else {
					out = full
				}
				if _, err := clW.Write(out); err != nil {
					b.Fatal(err)
				}
				ReleaseFrame(full)
			}
			cpu := processCPU() - cpu0
			clW.Close()
			<-done
			b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
			// The whole process's CPU (the broker's writes and the
			// client's reads included, alike for every mode): on a
			// shared machine, what ns/op cannot tell apart.
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
