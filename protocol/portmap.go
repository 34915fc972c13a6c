package protocol

import (
	"errors"
	"fmt"
	"sync"
)

// ErrPortRangeExhausted is returned when every port of the per-broker
// range is taken and a new broker shows up.
var ErrPortRangeExhausted = errors.New("per-broker port range exhausted")

// PortMap assigns each upstream node id a local port in [first, first+count)
// and never changes an assignment once made, so that addresses a client
// cached stay valid across metadata refreshes.
//
// Invariants:
//  1. Every assigned port is inside the range.
//  2. No two node ids share a port.
//  3. A node id keeps its port for the life of the map.
//
// A node's preferred slot is nodeID mod count, so the usual small ids
// (0, 1, 2) get first, first+1, first+2 and large KRaft ids (1001) still
// land inside the range; a collision takes the next free slot.
type PortMap struct {
	first, count int

	mu struct {
		sync.Mutex
		byNode map[int32]int // node id -> slot
		slots  []int32       // slot -> node id, or free
		used   []bool
	}
}

// NewPortMap returns an empty map over [first, first+count).
func NewPortMap(first, count int) *PortMap {
	m := &PortMap{first: first, count: count}
	m.mu.byNode = make(map[int32]int)
	m.mu.slots = make([]int32, count)
	m.mu.used = make([]bool, count)
	return m
}

// Lookup returns the port already assigned to node, if any.
func (m *PortMap) Lookup(node int32) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.mu.byNode[node]
	if !ok {
		return 0, false
	}
	return m.first + s, true
}

// Assign returns node's port, assigning one on first sight.
func (m *PortMap) Assign(node int32) (port int, isNew bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.assignLocked(node, -1)
}

// Reassign moves node away from a port that could not be listened on (held
// by another process) to the next free slot; the bad slot stays reserved.
// It is only used before the port was ever advertised.
func (m *PortMap) Reassign(node int32, badPort int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.mu.byNode, node)
	p, _, err := m.assignLocked(node, badPort-m.first)
	return p, err
}

func (m *PortMap) assignLocked(node int32, after int) (int, bool, error) {
	if s, ok := m.mu.byNode[node]; ok {
		return m.first + s, false, nil
	}
	if m.count <= 0 {
		return 0, false, ErrPortRangeExhausted
	}
	start := int(uint32(node) % uint32(m.count))
	if after >= 0 {
		start = after + 1
	}
	for i := 0; i < m.count; i++ {
		s := (start + i) % m.count
		if !m.mu.used[s] {
			m.mu.used[s] = true
			m.mu.slots[s] = node
			m.mu.byNode[node] = s
			return m.first + s, true, nil
		}
	}
	return 0, false, fmt.Errorf("%w: node %d needs a port, all %d ports from %d are taken",
		ErrPortRangeExhausted, node, m.count, m.first)
}
