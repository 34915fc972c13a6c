// Command proxyproc runs the protocol package's proxy as its own process so
// that the proxy benchmark can measure the proxy's CPU honestly from
// /proc/PID/stat, apart from the load client and the broker.
//
// It prints "ready ADDR" once upstream metadata has been fetched, and runs
// until SIGTERM/SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/protocol"
	"github.com/rtproxy/rtproxy/rules"
)

func main() {
	var (
		listen     = flag.String("listen", "127.0.0.1:0", "bootstrap listen address")
		upstream   = flag.String("upstream", "", "comma-separated seed brokers")
		portFirst  = flag.Int("broker-ports", 29100, "first per-broker port")
		cpuProfile = flag.String("cpuprofile", "", "write a CPU profile here until shutdown")
		guardFile  = flag.String("guard", "", "a guard rule file to enforce (make bench-guard)")
		viewFile   = flag.String("view", "", "a view rule file to serve (make bench-proxy's view phase)")
	)
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	p, err := protocol.New(protocol.Config{
		Listen:          *listen,
		AdvertiseHost:   "127.0.0.1",
		BrokerPortFirst: *portFirst,
		BrokerPortCount: 100,
		MaxFrameBytes:   100 << 20,
		// config.Default's decode budgets
		MaxDecodedBytes:      32 << 20,
		MaxRecordsPerRequest: 200_000,
		MaxDecodedBytesTotal: 128 << 20,
		Upstream:             strings.Split(*upstream, ","),
		ShutdownGrace:        2 * time.Second,
		Logger:               slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Registerer:           prometheus.NewRegistry(),
	})
	if err != nil {
		log.Fatal(err)
	}
	if *guardFile != "" {
		r, err := rules.LoadFile(*guardFile)
		if err != nil {
			log.Fatal(err)
		}
		if r.Guard == nil {
			log.Fatalf("%s is not a guard file", *guardFile)
		}
		p.SetGuards(benchGuards{r.Guard})
	}
	if *viewFile != "" {
		r, err := rules.LoadFile(*viewFile)
		if err != nil {
			log.Fatal(err)
		}
		if r.View == nil {
			log.Fatalf("%s is not a view file", *viewFile)
		}
		p.SetViews(benchViews{r})
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		for !p.Ready() {
			time.Sleep(10 * time.Millisecond)
		}
		fmt.Printf("ready %s\n", p.Addr())
	}()
	if err := p.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// benchGuards enforces one guard file, as cmd/rtproxy does (without its
// metrics and dead letters).
type benchGuards struct{ g *rules.Guard }

func (b benchGuards) For(topic string) protocol.Guard {
	if b.g.Matches(topic) {
		return b
	}
	return nil
}

func (b benchGuards) Check(topic string, partition int32, rec *protocol.ProducedRecord) (string, string, bool) {
	r := operators.Record{Topic: topic, Partition: partition, Key: rec.Key, Raw: rec.Value, Timestamp: rec.Timestamp}
	return b.g.Check(&r)
}

func (benchGuards) Refused(protocol.Refusal) {}

// benchViews serves one view file to every client it applies to, as
// cmd/rtproxy does (without its metrics).
type benchViews struct{ r *rules.Route }

func match(c protocol.ViewClient) rules.ViewClientMatch {
	return rules.ViewClientMatch{ClientID: c.ClientID, Principal: c.Principal, TLSSubject: c.TLSSubject}
}

func (b benchViews) Lookup(name string, c protocol.ViewClient) protocol.View {
	if name == b.r.Name && b.r.View.AppliesTo(match(c)) {
		return b
	}
	return nil
}

func (b benchViews) Virtual(c protocol.ViewClient) map[string]string {
	if b.r.InPlace() || !b.r.View.AppliesTo(match(c)) {
		return nil
	}
	return map[string]string{b.r.Name: b.r.View.Topic}
}

func (b benchViews) Name() string  { return b.r.Name }
func (b benchViews) Topic() string { return b.r.View.Topic }

var recordPool = sync.Pool{New: func() any { return new(operators.Record) }}

func (b benchViews) Apply(rec *protocol.ViewRecord) (bool, error) {
	r := recordPool.Get().(*operators.Record)
	defer func() { *r = operators.Record{}; recordPool.Put(r) }()
	*r = operators.Record{Topic: b.r.View.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: rec.Key,
		Raw: rec.Value, Timestamp: rec.Timestamp, EventTime: rec.Timestamp}
	out, keep, err := b.r.View.Run(r, rec.Scratch[:0])
	if cap(out) > cap(rec.Scratch) {
		rec.Scratch = out[:0]
	}
	if err != nil || !keep {
		return false, err
	}
	rec.Value = out
	return true, nil
}
