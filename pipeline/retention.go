package pipeline

import (
	"context"
	"time"
)

// Retention of a deleted route's state.
//
// A route whose rule file is deleted stops after a final checkpoint and its
// state stays, so restoring the file resumes where it stopped. With
// Config.StateRetention > 0 that state is dropped once the route has been
// out of the rule set longer than the retention; a file restored later then
// starts the route from source.start, like a new route. Dropping resets
// what the route keeps in Kafka as well (its consumer group's offsets, its
// changelog and repartition topics: reset.go); while another instance
// still runs the route, nothing is dropped and the drop is retried.
//
// The retention clock is the route's last checkpoint: a deleted route writes
// its final checkpoint as it stops, so that is when it left the rule set,
// and the clock survives a restart of the proxy. A route with state but no
// checkpoint record is timed from when this process first saw it absent.
//
// While some rule file is refused and has no running route, nothing is
// dropped: that file may be the absent route's own, broken at start, and a
// fix must still find its state.

// retentionTick is how often the retention check runs for a retention d.
func retentionTick(d time.Duration) time.Duration {
	return min(max(d/10, 100*time.Millisecond), time.Minute)
}

// retentionLoop drops expired state until ctx is done. It runs only when
// StateRetention > 0.
func (m *Manager) retentionLoop(ctx context.Context) {
	d := m.cfg.StateRetention
	if d <= 0 {
		return
	}
	t := time.NewTicker(retentionTick(d))
	defer t.Stop()
	absentSince := map[string]time.Time{} // routes without a checkpoint record
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m.dropExpired(now, d, absentSince)
			m.met.retentionSweeps.Inc()
		}
	}
}

// dropExpired drops the state of every route that has state, is not
// running and left the rule set more than d before now.
func (m *Manager) dropExpired(now time.Time, d time.Duration, absentSince map[string]time.Time) {
	// Holding applyMu keeps a restore from starting the route while its
	// state is being dropped: the restore then starts from source.start.
	m.applyMu.Lock()
	defer m.applyMu.Unlock()
	m.mu.Lock()
	if m.mu.closed || m.mu.ctx == nil {
		m.mu.Unlock()
		return
	}
	running := map[string]bool{}
	runningFiles := map[string]bool{}
	for name, r := range m.mu.routes {
		running[name] = true
		runningFiles[r.def.File] = true
	}
	for _, dr := range m.mu.desired {
		running[dr.Name] = true
		runningFiles[dr.File] = true
	}
	orphanErr := ""
	for file := range m.mu.ruleErrs {
		if !runningFiles[file] {
			orphanErr = file
		}
	}
	m.mu.Unlock()

	db := m.store()
	if db == nil {
		return // never opened: the directory held no state at the start, and no route has run since
	}
	infos, err := db.Routes()
	if err != nil {
		m.log.Warn("state retention: cannot list routes' state; will retry", "err", err)
		return
	}
	seen := map[string]bool{}
	for _, info := range infos {
		if running[info.Route] {
			continue
		}
		seen[info.Route] = true
		since := info.LastCheckpoint
		if since.IsZero() {
			if _, ok := absentSince[info.Route]; !ok {
				absentSince[info.Route] = now
			}
			since = absentSince[info.Route]
		}
		if now.Sub(since) <= d {
			continue
		}
		if orphanErr != "" {
			m.log.Debug("state retention: a refused rule file has no running route; keeping absent routes' state",
				"route", info.Route, "file", orphanErr)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		err := m.dropRouteState(ctx, info.Route)
		cancel()
		if err != nil {
			m.log.Warn("state retention: drop failed; will retry", "route", info.Route, "err", err)
			continue
		}
		delete(absentSince, info.Route)
		m.mu.Lock()
		delete(m.mu.stopped, info.Route)
		m.mu.Unlock()
		m.met.forgetRoute(info.Route)
		m.log.Info("state retention: the route's rule file has been gone longer than state_retention; its state is dropped and a restored file starts from source.start",
			"route", info.Route, "gone_since", since.UTC().Format(time.RFC3339), "state_retention", d)
	}
	for name := range absentSince {
		if !seen[name] {
			delete(absentSince, name)
		}
	}
}
