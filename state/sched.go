package state

import (
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// quietScheduler is pebble's compaction scheduler for a sidecar: it limits
// concurrent compactions to what the DB allows without permission, as
// pebble's default (ConcurrencyLimitScheduler) does, but grants only when
// something changed: a compaction ended (Done) or the DB raised what it
// allows (UpdateGetAllowedWithoutPermission, after each flush). The
// default also polls the DB every 100ms, ten wake-ups a second in a
// process that is otherwise at rest (docs/BENCHMARKS.md, "Footprint").
//
// Nothing waits forever without the poll: a compaction is refused only
// while as many run as are allowed (at least one), and each of those
// calls Done when it ends, which grants the waiting ones.
type quietScheduler struct {
	db DBForCompaction

	mu          sync.Mutex
	running     int
	allowed     int  // the DB's allowance when last asked
	closed      bool // unregistered: grant nothing more
	granting    bool // a grant loop runs (at most one)
	grantingEnd *sync.Cond
}

// DBForCompaction is pebble's view of the DB for its scheduler.
type DBForCompaction = pebble.DBForCompaction

var (
	_ pebble.CompactionScheduler   = (*quietScheduler)(nil)
	_ pebble.CompactionGrantHandle = (*quietScheduler)(nil)
)

func newQuietScheduler() *quietScheduler {
	s := &quietScheduler{}
	s.grantingEnd = sync.NewCond(&s.mu)
	return s
}

// Register is called once by pebble.Open.
func (s *quietScheduler) Register(_ int, db pebble.DBForCompaction) {
	s.mu.Lock()
	s.db = db
	s.mu.Unlock()
}

// Unregister is called by DB.Close: no grant runs after it returns.
func (s *quietScheduler) Unregister() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for s.granting {
		s.grantingEnd.Wait()
	}
}

// TrySchedule is the DB asking to start a compaction now.
func (s *quietScheduler) TrySchedule() (bool, pebble.CompactionGrantHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, nil
	}
	s.allowed = s.db.GetAllowedWithoutPermission()
	if s.running < s.allowed {
		s.running++
		return true, s
	}
	return false, nil
}

// UpdateGetAllowedWithoutPermission is called by the DB (with its own mutex
// held, so the grant runs on another goroutine) when its allowance may
// have grown.
func (s *quietScheduler) UpdateGetAllowedWithoutPermission() {
	s.mu.Lock()
	if s.closed || s.db == nil {
		s.mu.Unlock()
		return
	}
	now := s.db.GetAllowedWithoutPermission()
	grow := now > s.allowed
	s.allowed = now
	s.mu.Unlock()
	if grow {
		go s.grant()
	}
}

// Started, MeasureCPU and CumulativeStats: the handle's accounting, which
// a concurrency limit does not need.
func (s *quietScheduler) Started()                                          {}
func (s *quietScheduler) MeasureCPU(pebble.CompactionGoroutineKind)         {}
func (s *quietScheduler) CumulativeStats(pebble.CompactionGrantHandleStats) {}

// Done is called when a granted compaction ends: its slot goes to a
// waiting one.
func (s *quietScheduler) Done() {
	s.mu.Lock()
	s.running--
	s.mu.Unlock()
	s.grant()
}

// grant starts waiting compactions while slots are free.
func (s *quietScheduler) grant() {
	s.mu.Lock()
	for s.granting {
		s.grantingEnd.Wait()
	}
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.allowed = s.db.GetAllowedWithoutPermission()
	free := s.allowed - s.running
	if free <= 0 {
		s.mu.Unlock()
		return
	}
	s.granting = true
	s.mu.Unlock()
	for ; free > 0; free-- {
		if waiting, _ := s.db.GetWaitingCompaction(); !waiting {
			break
		}
		s.mu.Lock()
		s.running++ // Schedule may run the compaction, and its Done, at once
		s.mu.Unlock()
		if !s.db.Schedule(s) {
			s.mu.Lock()
			s.running--
			s.mu.Unlock()
			break
		}
	}
	s.mu.Lock()
	s.granting = false
	s.grantingEnd.Broadcast()
	s.mu.Unlock()
}
