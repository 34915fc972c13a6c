package state

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// model is what a namespace must look like: live is every write so far,
// durable what the last committed checkpoint holds.
type model struct {
	live    map[string]string
	durable map[string]string
	// cuts are the live maps at each pending freeze, oldest first.
	cuts []map[string]string
}

func openTest(t testing.TB, dir string) *DB {
	t.Helper()
	db, err := Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func scanAll(t testing.TB, kv KV, start, end []byte) map[string]string {
	t.Helper()
	got := map[string]string{}
	var prev []byte
	err := kv.Scan(start, end, func(k, v []byte) bool {
		if prev != nil && string(k) <= string(prev) {
			t.Fatalf("scan out of order: %q after %q", k, prev)
		}
		prev = append(prev[:0], k...)
		got[string(k)] = string(v)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestModelRandom drives two namespaces of a route with random sets,
// deletes, freezes, commits and crashes, and after every step compares
// Get and full and ranged Scans with the model.
func TestModelRandom(t *testing.T) {
	dir := t.TempDir()
	db := openTest(t, dir)
	defer func() { db.Close() }()
	rng := rand.New(rand.NewPCG(7, 9))
	steps := []string{"1-dedup-aa", "2-window-bb"}
	models := map[string]*model{}
	for _, s := range steps {
		models[s] = &model{live: map[string]string{}, durable: map[string]string{}}
	}
	var pending []*Frozen
	key := func() string { return fmt.Sprintf("k%03d", rng.IntN(200)) }
	for op := 0; op < 2000; op++ {
		step := steps[rng.IntN(len(steps))]
		m, kv := models[step], db.Namespace("r", step)
		switch r := rng.IntN(100); {
		case r < 50:
			k, v := key(), strconv.Itoa(op)
			if err := kv.Set([]byte(k), []byte(v)); err != nil {
				t.Fatal(err)
			}
			m.live[k] = v
		case r < 75:
			k := key()
			if err := kv.Delete([]byte(k)); err != nil {
				t.Fatal(err)
			}
			delete(m.live, k)
		case r < 86:
			f, err := db.Freeze("r")
			if err != nil {
				t.Fatal(err)
			}
			pending = append(pending, f)
			for _, mm := range models {
				mm.cuts = append(mm.cuts, maps.Clone(mm.live))
			}
		case r < 97:
			if len(pending) == 0 {
				continue
			}
			if err := pending[0].Commit(map[int32]int64{0: int64(op)}, nil); err != nil {
				t.Fatal(err)
			}
			pending = pending[1:]
			for _, mm := range models {
				mm.durable, mm.cuts = mm.cuts[0], mm.cuts[1:]
			}
		default:
			db.Close()
			db = openTest(t, dir)
			pending = nil
			for _, mm := range models {
				mm.live, mm.cuts = maps.Clone(mm.durable), nil
			}
		}
		for _, s := range steps {
			kv, want := db.Namespace("r", s), models[s].live
			if got := scanAll(t, kv, nil, nil); !maps.Equal(got, want) {
				t.Fatalf("op %d step %s: scan = %v, want %v", op, s, got, want)
			}
			k := key()
			v, ok, err := kv.Get([]byte(k))
			if wv, wok := want[k]; err != nil || ok != wok || string(v) != wv {
				t.Fatalf("op %d step %s: Get(%s) = %q %t %v, want %q %t", op, s, k, v, ok, err, wv, wok)
			}
			lo, hi := key(), key()
			if hi < lo {
				lo, hi = hi, lo
			}
			wantRange := map[string]string{}
			for k, v := range want {
				if k >= lo && k < hi {
					wantRange[k] = v
				}
			}
			if got := scanAll(t, kv, []byte(lo), []byte(hi)); !maps.Equal(got, wantRange) {
				t.Fatalf("op %d step %s: scan [%s,%s) = %v, want %v", op, s, lo, hi, got, wantRange)
			}
		}
	}
	// The exact counts in Routes match the durable model.
	for _, f := range pending {
		if err := f.Commit(map[int32]int64{0: 1}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, mm := range models {
		if len(mm.cuts) > 0 {
			mm.durable = mm.cuts[len(mm.cuts)-1]
		}
	}
	steps2, err := db.StepStats("r")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps2 {
		mm := models[s.Step]
		var bytes int64
		for k, v := range mm.durable {
			bytes += int64(len(k) + len(v))
		}
		if s.KVKeys != int64(len(mm.durable)) || s.KVBytes != bytes {
			t.Errorf("step %s: stats %d keys %d bytes, want %d keys %d bytes", s.Step, s.KVKeys, s.KVBytes, len(mm.durable), bytes)
		}
	}
}

// TestScanStopsAndCallsBack: returning false stops the scan, and fn may
// use the KV (even write) without deadlocking, also while a freeze waits.
func TestScanStopsAndCallsBack(t *testing.T) {
	db := openTest(t, t.TempDir())
	defer db.Close()
	kv := db.Namespace("r", "s")
	for i := 0; i < 10; i++ {
		kv.Set([]byte{byte('a' + i)}, []byte{byte('0' + i)})
	}
	if err := db.Checkpoint("r", nil, nil); err != nil {
		t.Fatal(err)
	}
	kv.Set([]byte("b2"), []byte("x"))
	var seen []string
	err := kv.Scan(nil, nil, func(k, v []byte) bool {
		seen = append(seen, string(k))
		if _, _, err := kv.Get(k); err != nil {
			t.Error(err)
		}
		// A write during the scan: not seen by this scan, seen after.
		if err := kv.Set(append([]byte("z"), k...), v); err != nil {
			t.Error(err)
		}
		done := make(chan struct{})
		go func() { db.Freeze("r"); close(done) }()
		<-done
		return len(seen) < 4
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "b2", "c"}; !slices.Equal(seen, want) {
		t.Fatalf("scan saw %v, want %v", seen, want)
	}
	got := scanAll(t, kv, []byte("z"), nil)
	if len(got) != 4 || got["zb2"] != "x" {
		t.Fatalf("writes during scan: %v", got)
	}
}

// TestConcurrentWritersAndCheckpoints: workers write their own keys and
// read them back while another goroutine freezes and commits; every read
// sees the worker's last write, and after a crash the state equals the
// last committed cut. Meant for -race.
func TestConcurrentWritersAndCheckpoints(t *testing.T) {
	dir := t.TempDir()
	db := openTest(t, dir)
	const workers, perWorker = 4, 3000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var ckMu sync.Mutex
	var lastCommitted map[string]string
	// written[w] is the worker's progress, read by the checkpointer at a
	// cut under the same lock that workers hold while writing, so each cut
	// corresponds to a known prefix of every worker's writes.
	var progMu sync.Mutex
	progress := make([]int, workers)
	// Workers pause halfway until a checkpoint has committed, so that on a
	// fast machine the writes cannot all finish before the first synced
	// commit, and cuts really do fall in the middle of the writes.
	firstCommit := make(chan struct{})
	var firstOnce sync.Once
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			progMu.Lock()
			f, err := db.Freeze("r")
			snap := slices.Clone(progress)
			progMu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
			if err := f.Commit(map[int32]int64{0: int64(snap[0])}, nil); err != nil {
				t.Error(err)
				return
			}
			want := map[string]string{}
			for w, n := range snap {
				for i := 0; i < n; i++ {
					want[fmt.Sprintf("w%d-%05d", w%2, i*2+w/2)] = strconv.Itoa(i)
				}
			}
			ckMu.Lock()
			lastCommitted = want
			ckMu.Unlock()
			firstOnce.Do(func() { close(firstCommit) })
		}
	}()
	var wwg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			// Two workers share each namespace, on disjoint keys.
			kv := db.Namespace("r", fmt.Sprintf("step%d", w%2))
			for i := 0; i < perWorker; i++ {
				if i == perWorker/2 {
					select {
					case <-firstCommit:
					case <-time.After(30 * time.Second):
						t.Errorf("worker %d: no checkpoint committed within 30s", w)
						return
					}
				}
				k := []byte(fmt.Sprintf("w%d-%05d", w%2, i*2+w/2))
				progMu.Lock()
				err := kv.Set(k, []byte(strconv.Itoa(i)))
				progress[w] = i + 1
				progMu.Unlock()
				if err != nil {
					t.Error(err)
					return
				}
				v, ok, err := kv.Get(k)
				if err != nil || !ok || string(v) != strconv.Itoa(i) {
					t.Errorf("worker %d: read back %q %t %v", w, v, ok, err)
					return
				}
			}
		}()
	}
	wwg.Wait()
	close(stop)
	wg.Wait()
	ckMu.Lock()
	want := lastCommitted
	ckMu.Unlock()
	db.Close()
	db = openTest(t, dir)
	defer db.Close()
	got := scanAll(t, db.Namespace("r", "step0"), nil, nil)
	maps.Copy(got, scanAll(t, db.Namespace("r", "step1"), nil, nil))
	if len(want) == 0 {
		t.Fatal("no checkpoint committed during the run")
	}
	if !maps.Equal(got, want) {
		t.Fatalf("after crash: %d keys, want %d from the last checkpoint", len(got), len(want))
	}
}

// TestCrashSIGKILL runs a child process that checkpoints, writes more and
// is killed with SIGKILL mid-stream; the reopened state is exactly the
// last checkpoint (the synced batch survived, the rest did not).
func TestCrashSIGKILL(t *testing.T) {
	if dir := os.Getenv("RTPROXY_STATE_CRASH_CHILD"); dir != "" {
		crashChild(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashSIGKILL$")
	cmd.Env = append(os.Environ(), "RTPROXY_STATE_CRASH_CHILD="+dir)
	cmd.SysProcAttr = testkit.ChildAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child writes forever until killed: kill it on every path out of
	// the test, including a t.Fatal before the SIGKILL below (a no-op after).
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	buf := make([]byte, 64)
	var got []byte
	for !slices.Contains(got, '\n') {
		n, err := out.Read(buf)
		if err != nil {
			t.Fatalf("child: %v (output %q)", err, got)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "checkpointed\n" {
		t.Fatalf("child said %q", got)
	}
	// Let it write uncommitted state for a moment, then kill it.
	time.Sleep(50 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	db := openTest(t, dir)
	defer db.Close()
	cp, ok, err := db.LoadCheckpoint("r")
	if err != nil || !ok {
		t.Fatalf("LoadCheckpoint: %v %v", ok, err)
	}
	if cp.Seq != 2 || cp.Offsets[0] != 2000 {
		t.Fatalf("checkpoint seq %d offsets %v, want seq 2 offset 2000", cp.Seq, cp.Offsets)
	}
	st := scanAll(t, db.Namespace("r", "dedup"), nil, nil)
	if len(st) != 2000 {
		t.Fatalf("%d keys after crash, want the 2000 checkpointed", len(st))
	}
	for i := 0; i < 2000; i++ {
		if st[fmt.Sprintf("id%06d", i)] != "1" {
			t.Fatalf("key id%06d missing after crash", i)
		}
	}
}

func crashChild(dir string) {
	db, err := Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	kv := db.Namespace("r", "dedup")
	for i := 0; i < 2000; i++ {
		kv.Set([]byte(fmt.Sprintf("id%06d", i)), []byte("1"))
		if i == 999 {
			db.Checkpoint("r", map[int32]int64{0: 1000}, nil)
		}
	}
	if err := db.Checkpoint("r", map[int32]int64{0: 2000}, nil); err != nil {
		fmt.Println("checkpoint:", err)
		os.Exit(1)
	}
	fmt.Println("checkpointed")
	for i := 2000; ; i++ {
		kv.Set([]byte(fmt.Sprintf("id%06d", i)), []byte("1"))
		kv.Delete([]byte(fmt.Sprintf("id%06d", i-2000)))
		if i%1000 == 0 {
			// A cut frozen but never committed must not survive either.
			db.Freeze("r")
		}
	}
}

// TestScanShortRangeCopiesNoNodes: a Scan of a few keys copies them out
// of the active overlay instead of cloning it, so the writes after it do
// not copy the btree nodes on their path (a clone marks every node
// shared). A stream join scans for partners before each write: with a
// clone per Scan each write copied ~10 KB of nodes. A long range is still
// read through a clone: writes made by its callback are not seen by it.
func TestScanShortRangeCopiesNoNodes(t *testing.T) {
	db := openTest(t, t.TempDir())
	defer db.Close()
	kv := db.Namespace("r", "s")
	key := func(i int) []byte { return fmt.Appendf(nil, "k%08d", i) }
	const n = 20_000
	for i := 0; i < n; i += 2 {
		kv.Set(key(i), []byte("v"))
	}
	var before, after runtime.MemStats
	const rounds = 500
	runtime.ReadMemStats(&before)
	for r := range rounds {
		i := (r * 7919 % (n / 2)) * 2
		seen := 0
		if err := kv.Scan(key(i), key(i+4), func(k, v []byte) bool { seen++; return true }); err != nil {
			t.Fatal(err)
		}
		if seen != 2 {
			t.Fatalf("scan [%s, %s) saw %d keys, want 2", key(i), key(i+4), seen)
		}
		kv.Set(key(i+1), []byte("w"))
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / rounds; per > 4<<10 {
		t.Fatalf("%d bytes allocated per scan and write: the writes copy btree nodes", per)
	}
	// A long range: the callback's writes inside the range are not seen.
	want := 0
	if err := kv.Scan(key(0), key(100), func(k, v []byte) bool { want++; return true }); err != nil {
		t.Fatal(err)
	}
	if want <= scanCopyMax {
		t.Fatalf("%d keys in the long range: it does not cover the clone", want)
	}
	var seen []string
	if err := kv.Scan(key(0), key(100), func(k, v []byte) bool {
		seen = append(seen, string(k))
		kv.Set(append(append([]byte(nil), k...), 'x'), v)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != want || slices.ContainsFunc(seen, func(s string) bool { return strings.HasSuffix(s, "x") }) {
		t.Fatalf("long scan saw %d keys (%v...)", len(seen), seen[:min(len(seen), 5)])
	}
}
