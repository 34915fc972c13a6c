package pipeline

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/rtproxy/rtproxy/state"
)

// The state store (pebble) is opened by the first route that starts, not
// by New, unless the state directory already holds one: a proxy without
// routes (pass-through) then never opens it, and saves what opening costs
// at rest: pebble's WAL and manifest writers, its block cache's tables,
// its goroutines, and the pages of the binary that pebble.Open runs
// (docs/BENCHMARKS.md, footprint; invariant 99). A directory with stored
// state is opened at the start as before, so that state retention runs
// from the start and a second process on the same directory is refused at
// once.

// errStateClosed is returned to a route that asks for the store after the
// manager closed it (a setup racing the shutdown).
var errStateClosed = errors.New("pipeline: state store closed")

// store returns the open state store, or nil while no route has needed it.
// A route's code past setupCheck always finds it open.
func (m *Manager) store() *state.DB { return m.db.Load() }

// openState opens the state store once; later calls return it. A failed
// open is returned to the route that asked (its setup retries) and tried
// again by the next.
func (m *Manager) openState() (*state.DB, error) {
	if db := m.db.Load(); db != nil {
		return db, nil
	}
	m.dbMu.Lock()
	defer m.dbMu.Unlock()
	if db := m.db.Load(); db != nil {
		return db, nil
	}
	if m.dbClosed {
		return nil, errStateClosed
	}
	db, err := state.OpenWithOptions(m.cfg.StateDir, m.log, m.cfg.StateOptions)
	if err != nil {
		return nil, fmt.Errorf("pipeline: open state %s: %w", m.cfg.StateDir, err)
	}
	// Whatever write finds the store broken (a checkpoint, a final one at
	// a reload, a drop), the gauge says so at once.
	db.OnBroken(func(error) { m.met.stateFailed.Set(1) })
	m.db.Store(db)
	return db, nil
}

// closeState closes the store if it was opened; no route opens it after.
func (m *Manager) closeState() error {
	m.dbMu.Lock()
	m.dbClosed = true
	db := m.db.Load()
	m.dbMu.Unlock()
	if db == nil {
		return nil
	}
	return db.Close()
}

// holdsState reports whether dir has anything in it: a store written by an
// earlier run (pebble's CURRENT, MANIFEST, OPTIONS and WAL files), or
// whatever else, which opening at the start checks as before. A missing or
// empty directory holds nothing.
func holdsState(dir string) (bool, error) {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if len(names) > 0 {
		return true, nil
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return false, nil
}
