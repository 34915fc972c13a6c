package shapes

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtproxy/rtproxy/internal/testkit"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/rules"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testkit.Cleanup()
	os.Exit(code)
}

// LiveSeeds are the fixed seeds of the live variants (here and in
// test/integration/shapes_test.go): 4 and 82 end in a switch right after
// a window (3 branches and 1), 12 in a switch after a join in a table
// after a window (3 branches, no default).
var liveSeeds = []uint64{4, 82, 12}

// LiveSessionSeeds are the fixed seeds of GenerateSessions' live variants:
// 104 (one session window over 3 partitions, 8 merges), 113 (two
// chained session windows and a drop_duplicates over 4 partitions), 27
// (two session windows, the second's rows to a switch that drops some).
var LiveSessionSeeds = []uint64{104, 113, 27}

// TestShapesLive: live shapes through one in-process instance against
// kfake, every output and dead letter equal to the reference's (what the
// flush records cause left out).
func TestShapesLive(t *testing.T) {
	type run struct {
		seed     uint64
		sessions bool
	}
	var runs []run
	for _, seed := range liveSeeds {
		runs = append(runs, run{seed, false})
	}
	for _, seed := range LiveSessionSeeds {
		runs = append(runs, run{seed, true})
	}
	for _, rn := range runs {
		seed := rn.seed
		name := fmt.Sprint(seed)
		gen := Generate
		if rn.sessions {
			name, gen = fmt.Sprint("sessions-", seed), GenerateSessions
		}
		t.Run(name, func(t *testing.T) {
			s := gen(seed, true, 3)
			def := load(t, s)
			topics := fmt.Sprintf("%s:%d,%s:1", s.Topic, s.Partitions, s.DLQ)
			for _, st := range s.SinkTopics() {
				topics += fmt.Sprintf(",%s:2", st)
			}
			addrs, _ := testkit.StartKfake(t, "-topics", topics)
			reg := prometheus.NewRegistry()
			// The settings whose defaults live in config (pipeline.New
			// requires them), as pipeline's own tests give them.
			m, err := pipeline.New(pipeline.Config{Seeds: addrs, StateDir: t.TempDir(), Registerer: reg,
				SessionTimeout: 10 * time.Second, GroupProtocol: "auto", StopTimeout: 8 * time.Second,
				Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if err != nil {
				t.Fatal(err)
			}
			m.Apply([]*rules.Route{def})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- m.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			keyed := 0
			for _, st := range s.Steps {
				if st.Keyed {
					keyed++
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				owned := 0
				for _, rs := range m.Routes() {
					if rs.Name == s.Name && rs.State == "running" {
						owned = len(rs.Owned)
					}
				}
				if owned == s.Partitions*(1+keyed) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the route owns %d of its %d partitions after 30s", owned, s.Partitions*(1+keyed))
				}
				time.Sleep(50 * time.Millisecond)
			}
			got := RunLive(t, addrs, s)
			if d := Diff(s.Expected(), got); d != "" {
				t.Fatalf("%s\n%s", s.Describe(), d)
			}
			if s.Branches != nil {
				// The flush records' own drops are the run's and may
				// be the reference's too.
				all, flush := s.SwitchDrops()
				if n := SwitchDropped(t, reg, s); n < float64(all-flush) || n > float64(all) {
					t.Errorf("the switch dropped %v records; the reference's %d, %d of them caused by flush records", n, all, flush)
				}
			}
			t.Logf("%d inputs, %d outputs and dead letters as the reference's (sinks %v)", len(s.Inputs), len(got), s.SinkTopics())
		})
	}
}
