package testkit

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

// Ports are picked below the kernel's ephemeral range (32768+) so an outgoing
// connection can never take a port we mean to reuse on a restart. Single
// ports come from the low part of the range and blocks from the rest: single
// ports scattered at random over the whole range would, after a few hundred
// tests in one binary, leave no free run of 100 for a proxy's broker
// listeners.
const (
	portLow    = 12000
	singleHigh = 16000 // single ports: [portLow, singleHigh); blocks: [singleHigh, portHigh)
	portHigh   = 32000
)

var portMu sync.Mutex
var portsHanded = map[int]bool{} // within this process, never hand a port out twice

// FreePorts returns n individual free loopback ports.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ps := make([]int, 0, n)
	for range n {
		ps = append(ps, pick(t, 1, portLow, singleHigh))
	}
	return ps
}

// FreePortBlock returns the first of n contiguous free loopback ports.
func FreePortBlock(t testing.TB, n int) int {
	t.Helper()
	return pick(t, n, singleHigh, portHigh)
}

// pick finds n contiguous free ports in [low, high), marks them handed out
// until the test ends (its processes are stopped by cleanups registered
// later, which run first), and returns the first.
func pick(t testing.TB, n, low, high int) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for attempt := 0; attempt < 200; attempt++ {
		first := low + rand.IntN(high-low-n)
		if blockFree(first, n) {
			for p := first; p < first+n; p++ {
				portsHanded[p] = true
			}
			t.Cleanup(func() {
				portMu.Lock()
				defer portMu.Unlock()
				for p := first; p < first+n; p++ {
					delete(portsHanded, p)
				}
			})
			return first
		}
	}
	t.Fatalf("no block of %d free ports in [%d,%d)", n, low, high)
	return 0
}

func blockFree(first, n int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for p := first; p < first+n; p++ {
		if portsHanded[p] {
			return false
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}
