package main

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// result is one route's account.
type result struct {
	acked, failed, outputs, distinct int64
	missing                          int64 // acknowledged, never read, not destroyed
	destroyed                        int64 // route A: destroyed with a deleted sink
	destroyedBy                      []int64
	repeatsSame, repeatsOther        int64
	unackedSeen                      int64 // read in the sink, but the producer got an error
	unparsed                         int64
	dlq, dlqOther                    int64
	missingInDLQ                     int64
	dlqReasons                       map[string]int64
	missingSample                    []string
	missingBuckets                   map[int64]int64 // 10 s bucket of the acknowledgement → missing ids
	repeatAt                         map[int64]int64
	repeatSample                     []string
}

// classify accounts for every acknowledged id of b. Route A's deletion
// rule: an id not read from the sink is "destroyed with the deleted sink"
// when its source offset o (partition p) lies in (low[p], up[p]) of a
// deletion: above the highest source offset of p the consumer had read
// -band-before before the delete (everything below was read by then, or
// would have been, but for a consumer lagging that much, in which case it
// is counted missing, not hidden) and below the route's done offset of p
// 2 s after the delete (those outputs were written to the deleted topic;
// later ones go to the recreated one).
func (s *soak) classify(b *book) result {
	var dels []deletion
	if b == s.books[0] {
		s.mu.Lock()
		dels = slices.Clone(s.deletions)
		s.mu.Unlock()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r := result{acked: b.acked, failed: b.failed, outputs: b.outputs, distinct: b.distinct,
		repeatsSame: b.repeatsSame, repeatsOther: b.repeatsOther, unparsed: b.unparsed,
		dlq: int64(len(b.dlqSeqs)), dlqOther: b.dlqOther, dlqReasons: map[string]int64{},
		destroyedBy: make([]int64, len(dels)), missingBuckets: map[int64]int64{},
		repeatAt: maps.Clone(b.repeatAt), repeatSample: slices.Clone(b.repeatSample)}
	for _, reason := range b.dlqSeqs {
		r.dlqReasons[reason]++
	}
	for seq := range b.ackPart {
		p := b.ackPart[seq]
		if p < 0 {
			if b.seen[seq] > 0 {
				r.unackedSeen++
			}
			continue
		}
		if b.seen[seq] > 0 {
			continue
		}
		o := b.ackOff[seq]
		destroyed := false
		for k, d := range dels {
			if int(p) < len(d.low) && int(p) < len(d.up) && o > d.low[p] && o < d.up[p] {
				r.destroyed++
				r.destroyedBy[k]++
				destroyed = true
				break
			}
		}
		if destroyed {
			continue
		}
		r.missing++
		if _, ok := b.dlqSeqs[int64(seq)]; ok {
			r.missingInDLQ++
		}
		r.missingBuckets[b.ackAt[seq]/int64(10*time.Second)]++
		if len(r.missingSample) < 20 {
			r.missingSample = append(r.missingSample, fmt.Sprintf("%s-%09d (%s/%d/%d, acked at %s)", b.letter, seq, b.src, p, o, clock(time.Duration(b.ackAt[seq]))))
		}
	}
	return r
}

func clock(d time.Duration) string {
	return fmt.Sprintf("+%02d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

// report prints the results and the markdown tables; it returns whether
// the soak passed (nothing missing, RSS within the bound).
func (s *soak) report(header string, finalRoutes []routeStatus, finalMetrics map[string]float64, finalExit string) bool {
	a, b := s.books[0], s.books[1]
	ra, rb := s.classify(a), s.classify(b)
	ok := ra.missing == 0 && rb.missing == 0
	s.mu.Lock()
	maxRSS, maxAt, lastRSS, kfRSS, stateUse := s.maxRSS, s.maxRSSAt, s.lastRSS, s.maxKfakeRSS, s.maxStateUse
	dels := slices.Clone(s.deletions)
	counts := map[string]int64{}
	for k, v := range s.counts {
		counts[k] = v
	}
	order := slices.Clone(s.countOrder)
	s.mu.Unlock()
	bound := int64(*rssBound) << 20
	rssOK := maxRSS <= bound
	ok = ok && rssOK
	// The hostile client: a bomb answered otherwise than MESSAGE_TOO_LARGE,
	// a produce kept waiting by slow announces, a malformed frame's
	// connection left open, fail the soak too.
	hostileOK := counts["hostile bombs answered wrongly"] == 0 && counts["hostile slow-announce rounds, produce beside them slow"] == 0 &&
		counts["hostile malformed frames, connection left open"] == 0
	ok = ok && hostileOK

	fmt.Printf("\n%s\n\n", header)
	for _, x := range []struct {
		b *book
		r result
	}{{a, ra}, {b, rb}} {
		r := x.r
		fmt.Printf("%s (%s → %s): %d acknowledged (%d produce errors, not counted), %d outputs read, %d distinct ids, missing %d, destroyed with a deleted sink %d, repeats of the same source record %d, ids read again from another source record %d, read but not acknowledged %d, unparsed %d, dead letters %d %v (+%d without an id)\n",
			x.b.route, x.b.src, x.b.sink, r.acked, r.failed, r.outputs, r.distinct, r.missing, r.destroyed, r.repeatsSame, r.repeatsOther, r.unackedSeen, r.unparsed, r.dlq, r.dlqReasons, r.dlqOther)
		if r.missing > 0 {
			fmt.Printf("  missing ids (first %d):\n    %s\n", len(r.missingSample), strings.Join(r.missingSample, "\n    "))
			fmt.Printf("  missing by acknowledgement time (10 s buckets):%s", buckets(r.missingBuckets))
			fmt.Printf("\n  of them in the dead-letter topic: %d\n", r.missingInDLQ)
		}
		if len(r.repeatAt) > 0 {
			fmt.Printf("  repeats by the time they were read (10 s buckets):%s\n  first repeats:\n    %s\n", buckets(r.repeatAt), strings.Join(r.repeatSample, "\n    "))
		}
	}
	for i, d := range dels {
		fmt.Printf("sink deletion %d at %s: recreated %s; destroyed %d ids; band low %v up %v (%s)\n",
			i+1, clock(d.at), d.recreated, ra.destroyedBy[i], d.low, d.up, d.upFrom)
	}
	s.mu.Lock()
	timeline := slices.Clone(s.timeline)
	s.mu.Unlock()
	fmt.Printf("\ntimeline (rule rewrites every %v and connection bursts every %v not shown):\n", *rulesEvery, *connsEvery)
	for _, m := range timeline {
		fmt.Printf("  %s %s\n", clock(m.at), m.what)
	}
	fmt.Printf("\nchaos and events:\n")
	for _, k := range order {
		fmt.Printf("  %-45s %d\n", k, counts[k])
	}
	needles := []string{
		"a topic the route writes to was deleted; recreated it",
		"rtproxy did not create it",
		"the state store failed",
		"route restored from checkpoint",
		"rules: applying rule set",
		"rule file refused",
		"shutdown grace exceeded",
		"rtproxy stopped cleanly",
		"level=ERROR",
		"panic",
	}
	lc := countLines(s.px.logPath, needles)
	fmt.Printf("\nrtproxy log (%s), lines containing:\n", s.px.logPath)
	for _, n := range needles {
		fmt.Printf("  %-55q %d\n", n, lc[n])
	}
	if lc["level=ERROR"] > 0 {
		errs := grepLines(s.px.logPath, "level=ERROR", 8)
		fmt.Printf("  first ERROR lines:\n    %s\n", strings.Join(errs, "\n    "))
	}
	fmt.Printf("\nat the end: /routes:")
	for _, r := range finalRoutes {
		fmt.Printf(" %s=%s", r.Name, r.State)
		if r.LastError != "" {
			fmt.Printf(" (last_error %q)", r.LastError)
		}
	}
	fmt.Printf("; rtproxy_state_store_failed %v; sink errors %v; rtproxy exit %s\n",
		finalMetrics["rtproxy_state_store_failed"], metricSum(finalMetrics, "rtproxy_pipeline_sink_errors_total"), finalExit)

	// The markdown tables for docs/BENCHMARKS.md.
	fmt.Printf("\n| route | acknowledged | seen in the sink | missing | destroyed with the deleted sink | repeats (same source record) | ids from another source record | dead letters |\n")
	fmt.Printf("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	fmt.Printf("| A: filter + set (`soak.a` → `soak.a.out`) | %d | %d | **%d** | %d | %d | %d | %d |\n", ra.acked, ra.distinct, ra.missing, ra.destroyed, ra.repeatsSame, ra.repeatsOther, ra.dlq+ra.dlqOther)
	fmt.Printf("| B: drop_duplicates by id, ttl 10m (`soak.b` → `soak.b.out`) | %d | %d | **%d** | — | %d | %d | %d |\n", rb.acked, rb.distinct, rb.missing, rb.repeatsSame, rb.repeatsOther, rb.dlq+rb.dlqOther)
	rssVerdict := "within"
	if !rssOK {
		rssVerdict = "**over**"
	}
	recreated := fmt.Sprintf("%d by rtproxy, %d by the soak", counts["sink recreated by rtproxy"], counts["sink recreated by the soak"])
	var destroyed []string
	for i := range dels {
		destroyed = append(destroyed, fmt.Sprint(ra.destroyedBy[i]))
	}
	var restarts []string
	var nRestarts int64
	for _, k := range order {
		if strings.HasPrefix(k, "rtproxy restarts") {
			restarts = append(restarts, fmt.Sprintf("%d %s", counts[k], strings.TrimSuffix(strings.TrimPrefix(k, "rtproxy restarts ("), ")")))
			nRestarts += counts[k]
		}
	}
	sort.Strings(restarts)
	fmt.Printf("\n| measure | value |\n|---|---|\n")
	fmt.Printf("| rtproxy RSS, max (bound %d MiB) | %d MiB at %s: %s the bound |\n", *rssBound, maxRSS>>20, clock(maxAt), rssVerdict)
	fmt.Printf("| rtproxy RSS at the end | %d MiB |\n", lastRSS>>20)
	fmt.Printf("| kfake restarts (SIGTERM, %v down, same data dir) | %d |\n", *kfakeDown, counts["kfake restarts"])
	fmt.Printf("| deletions of route A's sink | %d (recreated %s; destroyed ids per deletion: %s) |\n", counts["sink deletions"], recreated, strings.Join(destroyed, ", "))
	if s.tmpfs {
		fmt.Printf("| state dir filled to ENOSPC for %v, then freed | %d (the state store failed after %d of them) |\n", *fillHold, counts["state fills"], counts["state fills that broke the store"])
	} else {
		fmt.Printf("| state dir filled | skipped: %s |\n", s.tmpfsNote)
	}
	fmt.Printf("| rule rewrites (both files, atomic rename) | %d |\n", counts["rule rewrites"])
	fmt.Printf("| connection bursts (%d idle connections for %v) | %d (%d connections, %d failed) |\n", *connCount, *connHold, counts["connection bursts"], counts["burst connections opened"], counts["burst connections refused or failed"])
	if nRestarts > 0 {
		fmt.Printf("| rtproxy restarts | %d (%s) |\n", nRestarts, strings.Join(restarts, ", "))
	} else {
		fmt.Printf("| rtproxy restarts | 0 |\n")
	}
	if *hostileEvery > 0 {
		fmt.Printf("| hostile client rounds (every %v) | %d: bombs refused %d, answered wrongly %d, unanswered %d; produce beside 4 slow 64 MiB announces answered %d, slow %d, failed %d; malformed frames closed %d, left open %d |\n",
			*hostileEvery, counts["hostile rounds"], counts["hostile bombs refused (MESSAGE_TOO_LARGE)"], counts["hostile bombs answered wrongly"],
			counts["hostile bombs unanswered"], counts["hostile slow-announce rounds, produce beside them answered"],
			counts["hostile slow-announce rounds, produce beside them slow"], counts["hostile slow-announce rounds, produce beside them failed"],
			counts["hostile malformed frames, connection closed by the proxy"], counts["hostile malformed frames, connection left open"])
	}
	fmt.Printf("| unexpected exits | rtproxy %d, kfake %d |\n", counts["rtproxy unexpected exits"], counts["kfake unexpected exits"])
	fmt.Printf("| produce errors (not counted) | A %d, B %d |\n", ra.failed, rb.failed)
	fmt.Printf("| kfake RSS, max | %d MiB |\n", kfRSS>>20)
	if s.tmpfs {
		fmt.Printf("| state dir use, max (outside the fills) | %d MiB |\n", stateUse>>20)
	}
	fmt.Printf("| rtproxy exit at the end | %s |\n", finalExit)

	if rb.repeatsSame+rb.repeatsOther > 0 {
		logf("FINDING: route B (drop_duplicates) wrote %d ids more than once", rb.repeatsSame+rb.repeatsOther)
	}
	verdict := "PASS"
	if !ok {
		verdict = "FAIL"
	}
	fmt.Printf("\nsoak %s: missing A %d, B %d; RSS max %d MiB against %d MiB\n", verdict, ra.missing, rb.missing, maxRSS>>20, *rssBound)
	return ok
}

// buckets prints 10 s buckets as " +mm:ss:count".
func buckets(m map[int64]int64) string {
	ks := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, " %s:%d", clock(time.Duration(k)*10*time.Second), m[k])
	}
	return b.String()
}
