package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// every runs fn at first, then every interval, until ctx ends.
func every(ctx context.Context, wg *sync.WaitGroup, first, interval time.Duration, fn func()) {
	if interval <= 0 {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTimer(first)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			fn()
			t.Reset(interval)
		}
	}()
}

// startChaos starts the chaos actions; they stop when ctx ends (an action
// under way finishes first).
func (s *soak) startChaos(ctx context.Context, wg *sync.WaitGroup) {
	every(ctx, wg, *kfakeEvery, *kfakeEvery, s.restartKfake)
	every(ctx, wg, *deleteEvery/2, *deleteEvery, s.deleteSink)
	every(ctx, wg, *fillEvery*3/4, *fillEvery, s.fillState)
	every(ctx, wg, *rulesEvery, *rulesEvery, s.rewriteRules)
	every(ctx, wg, *connsEvery/2, *connsEvery, s.connBurst)
	every(ctx, wg, *hostileEvery/2, *hostileEvery, s.hostileRound)
}

// restartKfake stops the brokers (SIGTERM) and starts them again on the
// same ports and data directory.
func (s *soak) restartKfake() {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	at := since()
	logf("chaos: kfake restart: SIGTERM")
	how, took := s.kf.stop(time.Minute)
	logf("chaos: kfake stopped (%s) in %v; down for %v", how, took.Round(time.Millisecond), *kfakeDown)
	time.Sleep(*kfakeDown)
	t := time.Now()
	if _, err := s.kf.start("ready ", 5*time.Minute); err != nil {
		fatalf("kfake restart: %v", err)
	}
	s.count("kfake restarts")
	logf("chaos: kfake back in %v", time.Since(t).Round(time.Millisecond))
	s.mark(at, fmt.Sprintf("kfake restart (stop %v, down %v, start %v)", took.Round(time.Millisecond), *kfakeDown, time.Since(t).Round(time.Millisecond)))
}

// deletion is one delete of route A's sink and the band of source offsets
// whose outputs it may have destroyed (see classify).
type deletion struct {
	at        time.Duration
	low, up   []int64 // per source partition: outputs of offsets in (low, up) count as destroyed
	upFrom    string  // where up came from
	recreated string  // "by the route after ...", or "by the soak (the route did not)"
}

// deleteSink deletes route A's sink topic. The route should recreate it
// (it created it); if it has not after -recreate-wait, the soak recreates
// it as an operator would, and says so.
func (s *soak) deleteSink() {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	a := s.books[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.kfAddrs...))
	if err != nil {
		logf("chaos: delete sink: client: %v", err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before, _ := adm.ListEndOffsets(ctx, a.sink)
	var records int64
	before.Each(func(o kadm.ListedOffset) { records += o.Offset })
	d := deletion{at: since(), low: a.readAt(since() - *bandBefore)}
	resp, err := adm.DeleteTopics(ctx, a.sink)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		logf("chaos: delete %s failed: %v", a.sink, err)
		return
	}
	s.count("sink deletions")
	logf("chaos: deleted %s (it held ~%d records)", a.sink, records)
	// The consumer of the deleted topic stops here (keeping what it had
	// fetched); a new one reads the recreated topic from its start.
	s.restartSinkConsumer()
	if *verbose {
		go s.watchRoute(a, 30*time.Second)
	}

	time.Sleep(2 * time.Second)
	r, ok := s.adm.route(a.route)
	if ok && len(r.Partitions) == *partitions {
		d.up = make([]int64, *partitions)
		for _, p := range r.Partitions {
			d.up[p.Partition] = p.DoneOffset
		}
		d.upFrom = "done offsets in /routes 2s after the delete"
	} else {
		// The route is not running: its outputs after its group's commit
		// are written again when it resumes, so the commit bounds what
		// the deleted topic held.
		d.up = make([]int64, *partitions)
		offs, err := adm.FetchOffsets(ctx, "rtproxy."+a.route)
		if err == nil {
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Topic == a.src && o.Err == nil && int(o.Partition) < len(d.up) {
					d.up[o.Partition] = o.At
				}
			})
		}
		d.upFrom = fmt.Sprintf("the route's committed offsets 2s after the delete (/routes had no partitions; route %q; fetch err %v)", r.State, err)
	}
	t := time.Now()
	for {
		if parts := s.topicPartitions(a.sink); parts > 0 {
			r, _ := s.adm.route(a.route)
			d.recreated = fmt.Sprintf("by rtproxy, seen %v after the delete with %d partitions (route %q, last_error %q)",
				(time.Since(t) + 2*time.Second).Round(100*time.Millisecond), parts, r.State, r.LastError)
			s.count("sink recreated by rtproxy")
			break
		}
		if time.Since(t) > *recreateWait {
			r, _ := s.adm.route(a.route)
			logf("FINDING: %s not recreated %v after the delete; route %s is %q, last_error %q", a.sink, *recreateWait+2*time.Second, a.route, r.State, r.LastError)
			cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
			cr, err := adm.CreateTopic(cctx, int32(*partitions), -1, nil, a.sink)
			ccancel()
			if err == nil {
				err = cr.Err
			}
			d.recreated = fmt.Sprintf("by the soak, %v after the delete (the route did not)", *recreateWait+2*time.Second)
			if err != nil {
				d.recreated += fmt.Sprintf("; create failed: %v", err)
			}
			s.count("sink recreated by the soak")
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	logf("chaos: %s recreated %s; destroyed band (source offsets, per partition) low %v up %v (%s)", a.sink, d.recreated, d.low, d.up, d.upFrom)
	s.mu.Lock()
	s.deletions = append(s.deletions, d)
	s.mu.Unlock()
	s.mark(d.at, fmt.Sprintf("delete %s; recreated %s", a.sink, d.recreated))
}

// fillState fills the state directory's filesystem until ENOSPC, holds it
// full for -fill-hold, frees it, and restarts rtproxy if its state store
// failed (the documented remedy), as an operator or the kubelet would.
func (s *soak) fillState() {
	if !s.tmpfs {
		logf("chaos: fill state dir skipped (the state dir is not a tmpfs of its own: %s)", s.tmpfsNote)
		s.count("state fills skipped")
		return
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	path := filepath.Join(s.stateDir, "soak-fill")
	s.filling.Store(true)
	defer s.filling.Store(false)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		logf("chaos: fill: %v", err)
		return
	}
	var n int64
	var werr error
	for _, chunk := range []int{1 << 20, 4 << 10, 512} {
		buf := make([]byte, chunk)
		for {
			w, err := f.Write(buf)
			n += int64(w)
			if err != nil {
				werr = err
				break
			}
		}
	}
	f.Close()
	used, size := dirUsage(s.stateDir)
	logf("chaos: filled the state dir: wrote %d MiB (%v); fs %d of %d MiB used", n>>20, werr, used>>20, size>>20)
	if !errors.Is(werr, syscall.ENOSPC) {
		logf("chaos: fill: the write did not end with ENOSPC")
	}
	s.count("state fills")
	at := since()
	failed := false
	poll := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			if m, err := s.adm.metrics(); err == nil && m["rtproxy_state_store_failed"] == 1 {
				if !failed {
					logf("chaos: rtproxy_state_store_failed is 1")
				}
				failed = true
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	poll(*fillHold)
	os.Remove(path)
	used, _ = dirUsage(s.stateDir)
	logf("chaos: freed the state dir (%d MiB used)", used>>20)
	poll(3 * time.Second)
	rs, _ := s.adm.routes()
	states := ""
	for _, r := range rs {
		states += fmt.Sprintf(" %s=%s", r.Name, r.State)
		if r.LastError != "" {
			states += fmt.Sprintf(" (last_error %q)", r.LastError)
		}
	}
	broken := false
	for _, r := range rs {
		if strings.Contains(r.LastError, "state store failed") {
			broken = true
		}
	}
	switch {
	case failed:
		s.mark(at, "fill the state dir: rtproxy_state_store_failed 1; restart rtproxy")
		s.count("state fills that broke the store")
		logf("chaos: the state store failed; routes:%s; restarting rtproxy (SIGTERM, wait, start)", states)
		s.restartProxy("rtproxy_state_store_failed was 1")
	case broken:
		s.mark(at, "fill the state dir: the store failed (/routes), rtproxy_state_store_failed stayed 0; restart rtproxy")
		s.count("state fills that broke the store")
		s.count("store failures that rtproxy_state_store_failed missed")
		logf("FINDING: rtproxy_state_store_failed stayed 0, but /routes says the store failed; routes:%s; restarting rtproxy as an operator reading /routes would", states)
		s.restartProxy("routes in error, metric 0")
	default:
		s.mark(at, "fill the state dir: the store did not fail")
		logf("chaos: rtproxy_state_store_failed never became 1 while the disk was full; routes:%s", states)
		s.count("state fills without a store failure")
	}
}

// restartProxy stops rtproxy (SIGTERM) and starts it again with the same
// flags and state directory. The caller holds opMu.
func (s *soak) restartProxy(why string) {
	how, took := s.px.stop(time.Minute)
	logf("rtproxy stopped (%s) in %v", how, took.Round(time.Millisecond))
	s.startProxy()
	s.count("rtproxy restarts (" + why + ")")
}

// startProxy starts rtproxy and waits for /readyz and both routes running.
func (s *soak) startProxy() {
	t := time.Now()
	if _, err := s.px.start("", 0); err != nil {
		fatalf("start rtproxy: %v", err)
	}
	for !s.adm.ready() {
		if s.px.died() {
			logf("rtproxy exited while starting (%s):\n%s", s.px.exitText(), tail(s.px.logPath, 30))
			return // the supervisor restarts it
		}
		if time.Since(t) > 2*time.Minute {
			fatalf("rtproxy not ready after 2m:\n%s", tail(s.px.logPath, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
	ready := time.Since(t)
	for time.Since(t) < time.Minute {
		rs, _ := s.adm.routes()
		running := 0
		for _, r := range rs {
			if r.State == "running" {
				running++
			}
		}
		if running == 2 {
			logf("rtproxy (pid %d) ready in %v, both routes running in %v", s.px.pid(), ready.Round(time.Millisecond), time.Since(t).Round(time.Millisecond))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	rs, _ := s.adm.routes()
	logf("rtproxy (pid %d) ready in %v; routes not all running after 1m: %+v", s.px.pid(), ready.Round(time.Millisecond), rs)
}

// rewriteRules rewrites both rule files by atomic rename: route A's set
// value alternates (the oracle ignores it), route B's file changes only in
// a comment (its dedup state must survive the reload).
func (s *soak) rewriteRules() {
	s.mu.Lock()
	s.ruleVersion++
	v := s.ruleVersion
	s.mu.Unlock()
	if err := writeRule(s.rulesDir, "soak-a.yaml", ruleA(v)); err != nil {
		logf("chaos: rewrite rules: %v", err)
		return
	}
	if err := writeRule(s.rulesDir, "soak-b.yaml", ruleB(v)); err != nil {
		logf("chaos: rewrite rules: %v", err)
		return
	}
	s.count("rule rewrites")
	if *verbose {
		logf("chaos: rule files rewritten (version %d)", v)
	}
}

// connBurst opens -conns TCP connections to the bootstrap port, holds them
// idle, and closes them.
func (s *soak) connBurst() {
	var conns []net.Conn
	failed := 0
	var firstErr error
	for i := 0; i < *connCount; i++ {
		c, err := net.DialTimeout("tcp", s.bootstrap, 2*time.Second)
		if err != nil {
			failed++
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		conns = append(conns, c)
	}
	time.Sleep(*connHold)
	for _, c := range conns {
		c.Close()
	}
	s.count("connection bursts")
	s.add("burst connections opened", int64(len(conns)))
	s.add("burst connections refused or failed", int64(failed))
	if failed > 0 {
		logf("chaos: connection burst: %d opened, %d failed (first: %v)", len(conns), failed, firstErr)
	} else if *verbose {
		logf("chaos: connection burst: %d opened, held %v, closed", len(conns), *connHold)
	}
}

// writeRule writes a rule file by atomic rename, as an editor would.
func writeRule(dir, name, body string) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

// ruleA is route A, stateless: the filter keeps every record, the set
// value alternates between rewrites.
func ruleA(v int) string {
	return fmt.Sprintf(`# soak route A (stateless), rewrite %d
route: soak-a
source: { topic: soak.a, format: json }
sink: { topic: soak.a.out }
steps:
  - filter: value.seq >= 0
  - set: { soak_ver: %d }
`, v, v%2+1)
}

// ruleB is route B, stateful; rewrites change only the comment.
func ruleB(v int) string {
	return fmt.Sprintf(`# soak route B (stateful), rewrite %d: only this comment changes
route: soak-b
source: { topic: soak.b, format: json }
sink: { topic: soak.b.out }
steps:
  - drop_duplicates: { key: value.id, ttl: 10m }
`, v)
}

// watchRoute logs a route's status and its sink's partitions every second
// for a while (-v, after a delete).
func (s *soak) watchRoute(b *book, d time.Duration) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.kfAddrs...))
	if err != nil {
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Second) {
		parts, total := s.topicPartitions(b.sink), int64(0)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ends, _ := adm.ListEndOffsets(ctx, b.sink)
		cancel()
		ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
		r, _ := s.adm.route(b.route)
		lag := int64(0)
		for _, p := range r.Partitions {
			lag += p.Lag
		}
		b.mu.Lock()
		seen := b.distinct
		b.mu.Unlock()
		logf("watch: %s partitions %d records %d; route %s %q lag %d last_error %q; seen %d", b.sink, parts, total, b.route, r.State, lag, r.LastError, seen)
	}
}

// topicPartitions asks kfake how many partitions topic has (-1: it does
// not exist), with a new client each time: a client answers metadata
// requests from its cache, which still knows a deleted topic.
func (s *soak) topicPartitions(topic string) int {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.kfAddrs...))
	if err != nil {
		return -1
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return -1
	}
	if td, ok := md[topic]; ok && td.Err == nil && len(td.Partitions) > 0 {
		return len(td.Partitions)
	}
	return -1
}
