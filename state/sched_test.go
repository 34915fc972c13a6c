package state

import (
	"fmt"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// TestQuietSchedulerNoPollAndCompacts: the state DB runs no 100ms poll of
// its compaction scheduler (pebble's default periodicGranter goroutine),
// and compactions still run: many small flushes into L0 are compacted
// down by automatic compactions, and Close returns.
func TestQuietSchedulerNoPollAndCompacts(t *testing.T) {
	db, err := OpenWithOptions(t.TempDir(), nil, Options{MemTableBytes: 256 << 10, CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&sb, 2); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sb.String(), "periodicGranter") {
		t.Fatalf("pebble's periodic compaction granter runs:\n%s", sb.String())
	}
	val := make([]byte, 512)
	for i := 0; i < 12000; i++ {
		if err := db.pdb.Set([]byte(fmt.Sprintf("k%08d", i*7919%12000)), val, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
		if i%500 == 499 {
			if err := db.pdb.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The flushes leave 24 tables in L0; the compactions they trigger
	// (granted by the scheduler, in the background) bring it down.
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := db.pdb.Metrics()
		if m.Compact.Count > 0 && m.Levels[0].TablesCount <= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("compactions did not run: %d compactions, %d tables in L0", m.Compact.Count, m.Levels[0].TablesCount)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNoDiskHealthTickers: the state DB runs none of pebble's disk-health
// tickers (a goroutine per open WAL and manifest, and one for the file
// system, each ticking every 2 s to report slow writes to an event
// listener rtproxy does not set): an idle sidecar's wake-ups (issue 29).
// It still writes and syncs.
func TestNoDiskHealthTickers(t *testing.T) {
	db, err := OpenWithOptions(t.TempDir(), nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.pdb.Set([]byte("k"), []byte("v"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&sb, 2); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sb.String(), "diskHealthChecking") {
		t.Fatalf("pebble's disk-health tickers run:\n%s", sb.String())
	}
}
