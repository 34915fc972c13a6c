// Command scale is `make bench-scale`: it measures routes shared by several
// rtproxy instances (issue 9: every instance that runs a route joins the
// route's consumer group; keyed steps go through a repartition topic and log
// their state to a compacted changelog). Everything runs as real processes:
// test/kfakebroker (3 brokers) and the rtproxy binary, each built once.
// One run prints three tables:
//
//  1. scale: 1, 2 and 3 instances sharing a stateless route (filter + map)
//     and a windowed route (tumbling 1s keyed by value.user, on_update)
//     that read the same 8-partition source at 10k rec/s of 1 KiB JSON for
//     -duration: CPU per source record of the rtproxy processes (utime+stime
//     from /proc/PID/stat before and after), p50/p99/p999 end to end
//     (producer send_ns → receipt of the sink record), and correctness
//     (distinct outputs against the expected count, duplicates);
//
//  2. restore: a drop_duplicates route over -restore-keys distinct keys;
//     after its last checkpoint is committed and the instance left, a new
//     instance on an empty state dir is started and timed until /routes
//     shows its restore done (and rtproxy_state_restore_seconds is read);
//     then old keys must still be dropped and new ones pass;
//
//  3. hop: the added latency of a repartition hop: the same source and load
//     through a route with a filter that keeps everything, and through one
//     with drop_duplicates keyed by value.id (ids never repeat, so it keeps
//     everything too, after a repartition hop), in alternating rounds.
//
//     go run ./test/bench/scale [-only scale,restore,hop] [-profile]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/benchkit"
)

var (
	rate        = flag.Int("rate", 10000, "records per second into the source (scale and hop)")
	duration    = flag.Duration("duration", 20*time.Second, "measured time per scale phase and per hop round (after warmup)")
	warmup      = flag.Duration("warmup", 3*time.Second, "unmeasured load before each measured time")
	size        = flag.Int("size", 1024, "bytes per source record (scale and hop)")
	partitions  = flag.Int("partitions", 8, "partitions of every topic the benchmark creates")
	instances   = flag.String("instances", "1,2,3", "instance counts of the scale phases")
	restoreKeys = flag.Int64("restore-keys", 1_000_000, "distinct drop_duplicates keys to restore")
	hopRounds   = flag.Int("hop-rounds", 2, "rounds of (no repartition, repartition) in the hop phase")
	checkpoint  = flag.String("checkpoint", "1s", "checkpoint_interval of every route")
	only        = flag.String("only", "scale,restore,hop", "which phases to run")
	profile     = flag.Bool("profile", false, "record perf profiles of rtproxy during restore and the repartition rounds, and print their top")
	autoCreate  = flag.Bool("auto-create", false, "let kfake auto-create topics (rtproxy should create its repartition and changelog topics itself)")
	logLevel    = flag.String("log-level", "warn", "rtproxy --log-level")
	keep        = flag.Bool("keep", false, "keep the temporary directory (logs, state, perf data)")
	groupWait   = flag.Duration("group-wait", 60*time.Second, "how long to wait for a route's group to settle before the load starts anyway")
	proxySrc    = flag.String("rtproxy-src", "", "build rtproxy from this module tree instead of the working tree (e.g. an older commit from git archive), for comparisons")
	verbose     = flag.Bool("v", false, "print /routes of the restoring instance as it changes")
)

// env is one benchmark run: the binaries, kfake, and an admin client.
type env struct {
	root, tmp          string
	kfakeBin, proxyBin string
	addrs              []string
	kfake              *exec.Cmd
	adm                *kadm.Client
	cl                 *kgo.Client // adm's client, for raw requests
	ports              *ports
}

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	e := &env{root: benchkit.ModuleRoot(), ports: &ports{used: map[int]bool{}}}
	var err error
	e.tmp, err = os.MkdirTemp("", "bench-scale-")
	check(err)
	if *keep {
		log.Printf("keeping %s", e.tmp)
	} else {
		defer os.RemoveAll(e.tmp)
	}
	e.kfakeBin = filepath.Join(e.tmp, "kfakebroker")
	e.proxyBin = filepath.Join(e.tmp, "rtproxy")
	build(e.root, e.kfakeBin, "test/kfakebroker")
	if *proxySrc != "" {
		build(*proxySrc, e.proxyBin, "cmd/rtproxy")
	} else {
		build(e.root, e.proxyBin, "cmd/rtproxy")
	}
	rev, _ := exec.Command("git", "-C", e.root, "rev-parse", "--short", "HEAD").Output()
	e.addrs, e.kfake = startBroker(e.kfakeBin, *partitions, *autoCreate)
	defer func() { e.kfake.Process.Kill(); e.kfake.Wait() }()
	e.cl = e.client()
	e.adm = kadm.NewClient(e.cl)
	defer e.adm.Close()

	load, _ := os.ReadFile("/proc/loadavg")
	header := fmt.Sprintf("rtproxy scale benchmark — %s, commit %s, %d CPUs, %d partitions, %d B records at %d rec/s, %v measured (+%v warmup), checkpoint_interval %s; load average at start %s",
		runtime.Version(), strings.TrimSpace(string(rev)), runtime.NumCPU(), *partitions, *size, *rate, *duration, *warmup, *checkpoint,
		strings.Join(strings.Fields(string(load))[:3], " "))
	log.Print(header)

	phases := strings.Split(*only, ",")
	var out []string
	if slices.Contains(phases, "scale") {
		var rows []scaleRow
		for _, s := range strings.Split(*instances, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			check(err)
			rows = append(rows, e.scalePhase(n)...)
		}
		out = append(out, scaleTable(rows))
	}
	if slices.Contains(phases, "restore") {
		out = append(out, e.restorePhase().table())
	}
	if slices.Contains(phases, "hop") {
		out = append(out, e.hopPhase().table())
	}
	load, _ = os.ReadFile("/proc/loadavg")
	fmt.Printf("\n%s; at the end %s\n\n%s", header, strings.Join(strings.Fields(string(load))[:3], " "), strings.Join(out, "\n"))
}

// writeRules writes rule files (name → body) into a fresh directory.
func (e *env) writeRules(dir string, files map[string]string) string {
	p := filepath.Join(e.tmp, dir)
	check(os.MkdirAll(p, 0o755))
	for name, body := range files {
		check(os.WriteFile(filepath.Join(p, name+".yaml"), []byte(body), 0o644))
	}
	return p
}

func routeYAML(name, src, watermark, steps string) string {
	wm := ""
	if watermark != "" {
		wm = ", watermark: " + watermark
	}
	return fmt.Sprintf(`route: %s
source: { topic: %s, format: json%s }
sink: { topic: %s.out }
dead_letter: %s.dlq
checkpoint_interval: %s
steps:
%s
`, name, src, wm, name, name, *checkpoint, steps)
}

const (
	statelessSteps = `  - filter: value.amount >= 0
  - map: { id: value.id, user: value.user, amount: value.amount * 100, send_ns: value.send_ns }`
	windowSteps  = `  - window: { kind: tumbling, size: 1s, key: value.user, aggregate: { n: count(), send_ns: max(value.send_ns) }, emit: on_update }`
	keepAllSteps = `  - filter: value.id >= 0`
	dedupSteps   = `  - drop_duplicates: { key: value.id }`
)

// ---- 1. scale --------------------------------------------------------------

type scaleRow struct {
	n          int
	route      string
	sent       int64
	res        result
	dlq        int64
	cpu        []time.Duration // per instance, over the load (both routes)
	kfakeCPU   time.Duration
	idle       []time.Duration // per instance, over idleFor before the load
	idleFor    time.Duration
	settle     time.Duration
	group      string
	internal   []string
	cpuProfile string
}

func (e *env) scalePhase(n int) []scaleRow {
	src := fmt.Sprintf("s%d.in", n)
	rMap, rWin := fmt.Sprintf("s%d-map", n), fmt.Sprintf("s%d-win", n)
	topics := []string{src, rMap + ".out", rMap + ".dlq", rWin + ".out", rWin + ".dlq"}
	e.createTopics(topics...)
	defer e.deleteTopics([]string{rMap, rWin}, topics...)
	rules := e.writeRules(fmt.Sprintf("rules-s%d", n), map[string]string{
		rMap: routeYAML(rMap, src, "", statelessSteps),
		rWin: routeYAML(rWin, src, "2s", windowSteps),
	})
	log.Printf("scale: %d instance(s), routes %s and %s on %s", n, rMap, rWin, src)
	var ins []*instance
	for i := 0; i < n; i++ {
		ins = append(ins, e.startInstance(fmt.Sprintf("s%d-i%d", n, i), rules, filepath.Join(e.tmp, fmt.Sprintf("state-s%d-i%d", n, i))))
	}
	defer func() {
		for _, in := range ins {
			in.stop()
		}
	}()
	for _, in := range ins {
		in.waitReady(60 * time.Second)
	}
	waitRunning(ins, []string{rMap, rWin}, 60*time.Second)
	// The windowed route's repartition topic may only appear with its
	// first record; a trickle makes sure the group sees it.
	trickle := e.produceAt(src, 0, 200, time.Second)
	settleMap, gMap, _ := e.waitGroup(rMap, src, n, *groupWait)
	settleWin, gWin, _ := e.waitGroup(rWin, src, n, *groupWait)
	log.Printf("scale %d: groups settled in %v (%v) and %v (%v)", n, settleMap.Round(time.Millisecond), gMap, settleWin.Round(time.Millisecond), gWin)

	// Idle CPU (heartbeats, fetch polls, checkpoints with nothing new).
	const idleFor = 3 * time.Second
	i0 := cpuOf(ins)
	time.Sleep(idleFor)
	i1 := cpuOf(ins)

	readMap := e.readSink(rMap+".out", byID)
	defer readMap.close()
	readWin := e.readSink(rWin+".out", byWindow)
	defer readWin.close()
	// Let the readers consume the trickle before the measured load.
	readMap.waitFor(trickle, 2*time.Second, 10*time.Second)
	readWin.waitFor(trickle, 2*time.Second, 10*time.Second)

	c0, k0 := cpuOf(ins), cpuTime(e.kfake.Process.Pid)
	var prof *profiler
	if n == 3 {
		var pids []int
		for _, in := range ins {
			pids = append(pids, in.pid())
		}
		prof = e.startPerf(fmt.Sprintf("scale%d", n), pids...)
	}
	start := time.Now()
	from := start.Add(*warmup).UnixNano()
	sent := e.produceAt(src, trickle, *rate, *warmup+*duration)
	to := time.Now().UnixNano()
	// The trickle came first; every source record gives one output in each
	// sink.
	want := sent + trickle
	readMap.waitFor(want, 5*time.Second, 60*time.Second)
	readWin.waitFor(want, 5*time.Second, 60*time.Second)
	c1, k1 := cpuOf(ins), cpuTime(e.kfake.Process.Pid)
	profOut := prof.stop(fmt.Sprintf("scale%d", n))
	time.Sleep(2 * time.Second) // late duplicates
	var cpu, idle []time.Duration
	for i := range ins {
		cpu = append(cpu, c1[i]-c0[i])
		idle = append(idle, i1[i]-i0[i])
	}
	rows := []scaleRow{
		{n: n, route: "stateless (filter+map)", sent: want, res: readMap.result(from, to), dlq: e.endOffsets(rMap + ".dlq"),
			cpu: cpu, kfakeCPU: k1 - k0, idle: idle, idleFor: idleFor, settle: settleMap, group: gMap.String(), internal: e.internalTopics(rMap)},
		{n: n, route: "window 1s by user, on_update", sent: want, res: readWin.result(from, to), dlq: e.endOffsets(rWin + ".dlq"),
			cpu: cpu, kfakeCPU: k1 - k0, idle: idle, idleFor: idleFor, settle: settleWin, group: gWin.String(), internal: e.internalTopics(rWin),
			cpuProfile: profOut},
	}
	for _, r := range rows {
		log.Printf("scale %d %s: %s", n, r.route, r.line())
	}
	return rows
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

func (r scaleRow) line() string {
	return fmt.Sprintf("sent %d, outputs %d, distinct %d, dups %d, unparsed %d, dead letters %d, p50 %s p99 %s p999 %s (n=%d), CPU %v, kfake CPU %v",
		r.sent, r.res.total, r.res.distinct, r.res.dups, r.res.unparsed, r.dlq, ms(r.res.q(.5)), ms(r.res.q(.99)), ms(r.res.q(.999)), len(r.res.lats), r.cpu, r.kfakeCPU)
}

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

func scaleTable(rows []scaleRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### 1. Instances sharing two routes (one source, %d rec/s, %d B, %d partitions)\n\n", *rate, *size, *partitions)
	b.WriteString("| instances | route | expected outputs | distinct | duplicates | missing | dead letters | p50 | p99 | p999 |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		missing := r.sent - r.res.distinct
		fmt.Fprintf(&b, "| %d | %s | %d | %d | %d | %d | %d | %s | %s | %s |\n", r.n, r.route, r.sent, r.res.distinct, r.res.dups, missing, r.dlq,
			ms(r.res.q(.5)), ms(r.res.q(.99)), ms(r.res.q(.999)))
	}
	b.WriteString("\n| instances | rtproxy CPU per source record (both routes) | per instance (CPU-s over the load) | idle CPU per instance | kfake CPU per source record | group settled after |\n")
	b.WriteString("|---:|---:|---|---|---:|---:|\n")
	for i := 0; i < len(rows); i += 2 {
		r := rows[i]
		var per, idle []string
		for j := range r.cpu {
			per = append(per, fmt.Sprintf("%.2f", r.cpu[j].Seconds()))
			idle = append(idle, fmt.Sprintf("%.0f ms/s", float64(r.idle[j].Milliseconds())/r.idleFor.Seconds()))
		}
		settle := max(r.settle, rows[i+1].settle)
		fmt.Fprintf(&b, "| %d | %.1f µs | %s | %s | %.1f µs | %v |\n", r.n, float64(sum(r.cpu).Microseconds())/float64(r.sent),
			strings.Join(per, " + "), strings.Join(idle, ", "), float64(r.kfakeCPU.Microseconds())/float64(r.sent), settle.Round(100*time.Millisecond))
	}
	b.WriteString("\nGroups when the load started, and the topics rtproxy made:\n\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "- %d instance(s), %s: %s; %v\n", r.n, r.route, r.group, r.internal)
	}
	for _, r := range rows {
		if r.cpuProfile != "" {
			fmt.Fprintf(&b, "\n```\n%s```\n", r.cpuProfile)
		}
	}
	return b.String()
}

// ---- 2. restore ------------------------------------------------------------

type restoreResult struct {
	keys          int64
	fill          time.Duration // instance A: 1M records in → 1M outputs
	commitWait    time.Duration
	changelog     []string
	changelogN    int64
	stopA         time.Duration
	ready         time.Duration // B: start → /readyz
	assigned      time.Duration // B: start → first partition owned
	done          time.Duration // B: start → restore done
	doneSeen      bool
	metricSeconds float64
	metricRecords float64
	metricLines   []string
	restoreCPU    time.Duration
	newPassed     int64 // new keys that passed (should be all)
	oldPassed     int64 // old keys re-sent after the restore that passed again (should be 0)
	routeSeconds  float64
	restoring     time.Duration // B: start → restore state "restoring" first seen
	dups          int64
	logTasks      int
	logRecords    int64
	logKeys       int64
	logLongest    time.Duration
	logTotal      time.Duration
	statusAtDone  string
	profile       string
	note          string
}

func (e *env) restorePhase() restoreResult {
	const route = "rs-dedup"
	src := "rs.in"
	topics := []string{src, route + ".out", route + ".dlq"}
	e.createTopics(topics...)
	defer e.deleteTopics([]string{route}, topics...)
	rules := e.writeRules("rules-rs", map[string]string{route: routeYAML(route, src, "", dedupSteps)})
	res := restoreResult{keys: *restoreKeys}

	log.Printf("restore: instance A fills %d keys", res.keys)
	a := e.startInstance("rs-a", rules, filepath.Join(e.tmp, "state-rs-a"))
	defer a.stop()
	a.waitReady(60 * time.Second)
	waitRunning([]*instance{a}, []string{route}, 60*time.Second)
	sink := e.readSink(route+".out", byID)
	defer sink.close()
	t0 := time.Now()
	e.produceBulk(src, 0, res.keys)
	log.Printf("restore: %d records produced in %v", res.keys, time.Since(t0).Round(time.Millisecond))
	sink.waitFor(res.keys, 60*time.Second, 15*time.Minute)
	res.fill = time.Since(t0)
	if d := sink.distinct(); d < res.keys {
		log.Printf("restore: instance A emitted only %d of %d keys", d, res.keys)
		res.note = fmt.Sprintf("instance A emitted %d of %d keys before it stalled; ", d, res.keys)
	}
	log.Printf("restore: A emitted %d distinct in %v", sink.distinct(), res.fill.Round(time.Millisecond))

	// Wait for the checkpoint: the group's commits cover the source and the
	// repartition topic.
	t1 := time.Now()
	for {
		caught, what := e.committedCaughtUp(route, append([]string{src}, e.topicsWithSuffix(route, ".repartition")...))
		if caught {
			log.Printf("restore: checkpoint committed (%s) after %v", what, time.Since(t1).Round(time.Millisecond))
			break
		}
		if time.Since(t1) > 2*time.Minute {
			log.Printf("restore: group commits not caught up after 2m (%s); going on", what)
			res.note += "group commits never covered the input (" + what + "); "
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	res.commitWait = time.Since(t1)
	t2 := time.Now()
	a.stop()
	res.stopA = time.Since(t2)
	res.changelog = e.topicsWithSuffix(route, ".changelog")
	for _, t := range res.changelog {
		res.changelogN += e.endOffsets(t)
	}
	log.Printf("restore: A stopped in %v; changelog %v holds %d records", res.stopA.Round(time.Millisecond), res.changelog, res.changelogN)

	// Instance B, empty state dir.
	b := e.startInstanceLog("rs-b", rules, filepath.Join(e.tmp, "state-rs-b"), "info")
	defer b.stop()
	prof := e.startPerf("restore", b.pid())
	c0 := cpuTime(b.pid())
	b.waitReady(60 * time.Second)
	res.ready = time.Since(b.started)
	var lastStatus string
	sawRestoring := false
	for {
		el := time.Since(b.started)
		r := b.route(route)
		if r != nil {
			st := restoreOf(r)
			if *verbose {
				if js, _ := json.Marshal(r); string(js) != lastStatus {
					log.Printf("restore +%v: %s", el.Round(time.Millisecond), js)
					lastStatus = string(js)
				}
			}
			owned, _ := r["owned"].([]any)
			if len(owned) > 0 && res.assigned == 0 {
				res.assigned = el
			}
			if st.found && !st.done && !sawRestoring {
				sawRestoring = true
				res.restoring = el
			}
			if rs, ok := r["restore"].(map[string]any); ok {
				res.routeSeconds, _ = rs["seconds"].(float64)
			}
			// Done: every partition owned (source and repartition), restore
			// idle again after it was seen restoring (or after it restored
			// every key), route running.
			if st.found && st.done && len(owned) == 2**partitions && (sawRestoring || st.records >= float64(res.keys)) && r["state"] == "running" {
				res.done, res.doneSeen = el, true
				js, _ := json.Marshal(r)
				res.statusAtDone = string(js)
				break
			}
		}
		if el > 5*time.Minute {
			js, _ := json.Marshal(r)
			res.statusAtDone = string(js)
			res.note += "no restore-done state seen in /routes within 5 minutes; "
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	res.restoreCPU = cpuTime(b.pid()) - c0
	res.logTasks, res.logRecords, res.logKeys, res.logLongest, res.logTotal = b.restoreLog()
	res.profile = prof.stop("restore")
	for _, l := range b.metrics("rtproxy_state_restore") {
		if !strings.Contains(l, "_bucket") {
			res.metricLines = append(res.metricLines, l)
		}
	}
	res.metricSeconds, _ = metricSum(res.metricLines, "rtproxy_state_restore_seconds")
	if v, ok := metricSum(res.metricLines, "rtproxy_state_restore_seconds_sum"); ok {
		res.metricSeconds = v
	}
	res.metricRecords, _ = metricSum(res.metricLines, "rtproxy_state_restore_records_total")
	log.Printf("restore: B ready after %v, first partition owned at %v, done at %v (seen %v); metrics %v",
		res.ready.Round(time.Millisecond), res.assigned.Round(time.Millisecond), res.done.Round(time.Millisecond), res.doneSeen, res.metricLines)

	// The keys must still be remembered: 1000 old ids are dropped, 1000 new
	// ones pass.
	before := sink.distinct()
	e.produceBulk(src, 0, 1000)
	e.produceBulk(src, res.keys, res.keys+1000)
	sink.waitFor(before+1000, 10*time.Second, 2*time.Minute)
	time.Sleep(3 * time.Second)
	all := sink.result(0, 0)
	res.dups = all.dups
	sink.mu.Lock()
	for id := res.keys; id < res.keys+1000; id++ {
		if sink.ids[id] > 0 {
			res.newPassed++
		}
	}
	for id := int64(0); id < 1000; id++ {
		if sink.ids[id] > 1 {
			res.oldPassed++
		}
	}
	sink.mu.Unlock()
	return res
}

// restoreStatus is what /routes says of restore progress, found under any
// key containing "restor" (the format is new: restore_state, restore: {...},
// per-partition fields...).
type restoreStatus struct {
	found   bool
	done    bool
	states  []string
	records float64
}

var doneWords = map[string]bool{"done": true, "restored": true, "complete": true, "completed": true, "ready": true,
	"local": true, "none": true, "idle": true, "false": true, "": true}

func restoreOf(r map[string]any) restoreStatus {
	var st restoreStatus
	var walk func(k string, v any, in bool)
	walk = func(k string, v any, in bool) {
		in = in || strings.Contains(strings.ToLower(k), "restor")
		switch x := v.(type) {
		case map[string]any:
			for k2, v2 := range x {
				walk(k2, v2, in)
			}
		case []any:
			for _, v2 := range x {
				walk(k, v2, in)
			}
		case string:
			if in && !strings.Contains(k, "error") && !strings.HasSuffix(k, "_at") {
				st.found = true
				st.states = append(st.states, strings.ToLower(x))
			}
		case bool:
			if in {
				st.found = true
				st.states = append(st.states, strconv.FormatBool(x != strings.Contains(k, "done")))
			}
		case float64:
			if in && strings.Contains(k, "record") {
				st.found = true
				st.records += x
			}
		}
	}
	walk("", r, false)
	st.done = st.found
	for _, s := range st.states {
		if !doneWords[s] {
			st.done = false
		}
	}
	return st
}

func (r restoreResult) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### 2. Restore of %d drop_duplicates keys on an empty state dir\n\n", r.keys)
	b.WriteString("| measure | value |\n|---|---:|\n")
	fmt.Fprintf(&b, "| instance A: %d records in → all outputs out | %v |\n", r.keys, r.fill.Round(time.Millisecond))
	fmt.Fprintf(&b, "| wait for the group commit to cover the input | %v |\n", r.commitWait.Round(time.Millisecond))
	fmt.Fprintf(&b, "| instance A: SIGTERM → exit (final checkpoint) | %v |\n", r.stopA.Round(time.Millisecond))
	fmt.Fprintf(&b, "| changelog records (%s) | %d |\n", strings.Join(r.changelog, ", "), r.changelogN)
	fmt.Fprintf(&b, "| instance B: start → /readyz | %v |\n", r.ready.Round(time.Millisecond))
	fmt.Fprintf(&b, "| instance B: start → first partition owned | %v |\n", r.assigned.Round(time.Millisecond))
	fmt.Fprintf(&b, "| instance B: start → restore state \"restoring\" first seen | %v |\n", r.restoring.Round(time.Millisecond))
	if r.doneSeen {
		fmt.Fprintf(&b, "| **instance B: start → restore done in /routes** (target < 10 s) | **%v** |\n", r.done.Round(time.Millisecond))
	} else {
		b.WriteString("| **instance B: start → restore done in /routes** (target < 10 s) | **not seen** |\n")
	}
	fmt.Fprintf(&b, "| /routes restore.seconds | %.2f s |\n", r.routeSeconds)
	fmt.Fprintf(&b, "| rtproxy_state_restore_seconds (histogram sum over partitions) | %.2f s |\n", r.metricSeconds)
	fmt.Fprintf(&b, "| rtproxy_state_restore_records_total | %.0f |\n", r.metricRecords)
	fmt.Fprintf(&b, "| instance B CPU from start to restore done | %.2f s |\n", r.restoreCPU.Seconds())
	fmt.Fprintf(&b, "| instance B log, \"state restored from changelog\": tasks / records read / keys rebuilt | %d / %d / %d |\n", r.logTasks, r.logRecords, r.logKeys)
	fmt.Fprintf(&b, "| instance B log: longest task restore / sum over tasks | %v / %v |\n", r.logLongest.Round(time.Millisecond), r.logTotal.Round(time.Millisecond))
	fmt.Fprintf(&b, "| after the restore: new keys passed (of 1000) | %d |\n", r.newPassed)
	fmt.Fprintf(&b, "| after the restore: old keys re-sent that passed again (of 1000; want 0) | %d |\n", r.oldPassed)
	fmt.Fprintf(&b, "| duplicate outputs over the whole phase (want 0) | %d |\n", r.dups)
	if r.note != "" {
		fmt.Fprintf(&b, "\nNote: %s\n", strings.TrimSuffix(r.note, "; "))
	}
	fmt.Fprintf(&b, "\nRestore metrics: `%s`\n\n/routes at restore done: `%s`\n", strings.Join(r.metricLines, "`, `"), r.statusAtDone)
	if r.profile != "" {
		fmt.Fprintf(&b, "\n```\n%s```\n", r.profile)
	}
	return b.String()
}

// ---- 3. hop ----------------------------------------------------------------

type hopRound struct {
	variant string
	round   int
	sent    int64
	res     result
	cpu     time.Duration
}

type hopResult struct {
	rounds   []hopRound
	pooled   map[string]result
	sent     map[string]int64
	cpu      map[string]time.Duration
	totals   map[string]result
	internal []string
	profile  string
}

func (e *env) hopPhase() hopResult {
	variants := []struct{ name, route, src, steps string }{
		{"no repartition (filter keeps all)", "hop0", "hop0.in", keepAllSteps},
		{"repartition (drop_duplicates by value.id)", "hop1", "hop1.in", dedupSteps},
	}
	files := map[string]string{}
	var topics, routes []string
	for _, v := range variants {
		files[v.route] = routeYAML(v.route, v.src, "", v.steps)
		topics = append(topics, v.src, v.route+".out", v.route+".dlq")
		routes = append(routes, v.route)
	}
	e.createTopics(topics...)
	defer e.deleteTopics(routes, topics...)
	rules := e.writeRules("rules-hop", files)
	in := e.startInstance("hop", rules, filepath.Join(e.tmp, "state-hop"))
	defer in.stop()
	in.waitReady(60 * time.Second)
	waitRunning([]*instance{in}, routes, 60*time.Second)
	readers := map[string]*sinkReader{}
	next := map[string]int64{}
	for _, v := range variants {
		next[v.name] = e.produceAt(v.src, 0, 200, time.Second)
		e.waitGroup(v.route, v.src, 1, *groupWait)
		readers[v.name] = e.readSink(v.route+".out", byID)
		defer readers[v.name].close()
		readers[v.name].waitFor(next[v.name], 2*time.Second, 10*time.Second)
	}
	trickle := maps.Clone(next)
	res := hopResult{pooled: map[string]result{}, sent: map[string]int64{}, cpu: map[string]time.Duration{}, totals: map[string]result{}}
	var prof *profiler
	for round := 1; round <= *hopRounds; round++ {
		for _, v := range variants {
			log.Printf("hop round %d: %s", round, v.name)
			if v.route == "hop1" && round == *hopRounds {
				prof = e.startPerf("hop", in.pid())
			}
			c0 := cpuTime(in.pid())
			start := time.Now()
			from := start.Add(*warmup).UnixNano()
			sent := e.produceAt(v.src, next[v.name], *rate, *warmup+*duration)
			next[v.name] += sent
			to := time.Now().UnixNano()
			readers[v.name].waitFor(next[v.name], 5*time.Second, 60*time.Second)
			c1 := cpuTime(in.pid())
			if v.route == "hop1" && round == *hopRounds {
				res.profile = prof.stop("hop (repartition rounds)")
			}
			r := readers[v.name].result(from, to)
			hr := hopRound{variant: v.name, round: round, sent: sent, res: r, cpu: c1 - c0}
			log.Printf("hop round %d %s: p50 %s p99 %s p999 %s (n=%d), CPU %.1f µs/rec", round, v.name, ms(r.q(.5)), ms(r.q(.99)), ms(r.q(.999)),
				len(r.lats), float64(hr.cpu.Microseconds())/float64(sent))
			res.rounds = append(res.rounds, hr)
			p := res.pooled[v.name]
			p.lats = append(p.lats, r.lats...)
			res.pooled[v.name] = p
			res.sent[v.name] += sent
			res.cpu[v.name] += hr.cpu
		}
	}
	time.Sleep(2 * time.Second)
	res.internal = append(e.internalTopics("hop0"), e.internalTopics("hop1")...)
	for _, v := range variants {
		p := res.pooled[v.name]
		slices.Sort(p.lats)
		res.pooled[v.name] = p
		res.totals[v.name] = readers[v.name].result(0, 0)
		t := res.totals[v.name]
		t.total -= trickle[v.name] // the trickle before the rounds
		t.distinct -= trickle[v.name]
		res.totals[v.name] = t
	}
	return res
}

func (h hopResult) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### 3. Added latency of a repartition hop (1 instance, %d rec/s, %d B, %d partitions, %d rounds of %v each)\n\n", *rate, *size, *partitions, *hopRounds, *duration)
	b.WriteString("| route | round | records | p50 | p99 | p999 | rtproxy CPU per record |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range h.rounds {
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %.1f µs |\n", r.variant, r.round, len(r.res.lats), ms(r.res.q(.5)), ms(r.res.q(.99)), ms(r.res.q(.999)),
			float64(r.cpu.Microseconds())/float64(r.sent))
	}
	names := []string{"no repartition (filter keeps all)", "repartition (drop_duplicates by value.id)"}
	for _, n := range names {
		p := h.pooled[n]
		fmt.Fprintf(&b, "| %s | all | %d | %s | %s | %s | %.1f µs |\n", n, len(p.lats), ms(p.q(.5)), ms(p.q(.99)), ms(p.q(.999)),
			float64(h.cpu[n].Microseconds())/float64(max(h.sent[n], 1)))
	}
	a, c := h.pooled[names[0]], h.pooled[names[1]]
	fmt.Fprintf(&b, "\n**Added by the repartition hop (pooled): p50 %+.2f ms, p99 %+.2f ms, p999 %+.2f ms** (target: p99 ≤ +1 ms)\n",
		float64(c.q(.5)-a.q(.5))/1e6, float64(c.q(.99)-a.q(.99))/1e6, float64(c.q(.999)-a.q(.999))/1e6)
	b.WriteString("\n| route | sent | distinct outputs | duplicates |\n|---|---:|---:|---:|\n")
	for _, n := range names {
		t := h.totals[n]
		fmt.Fprintf(&b, "| %s | %d | %d | %d |\n", n, h.sent[n], t.distinct, t.dups)
	}
	fmt.Fprintf(&b, "\nTopics rtproxy made: %v\n", h.internal)
	if h.profile != "" {
		fmt.Fprintf(&b, "\n```\n%s```\n", h.profile)
	}
	return b.String()
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
