package testkit

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

// Ports are picked below the kernel's ephemeral range (32768+) so an outgoing
// connection can never take a port we mean to reuse on a restart.
const (
	portLow  = 12000
	portHigh = 32000
)

var portMu sync.Mutex
var portsHanded = map[int]bool{} // within this process, never hand a port out twice

// FreePorts returns n individual free loopback ports.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ps := make([]int, 0, n)
	for range n {
		ps = append(ps, FreePortBlock(t, 1))
	}
	return ps
}

// FreePortBlock returns the first of n contiguous free loopback ports.
func FreePortBlock(t testing.TB, n int) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for attempt := 0; attempt < 200; attempt++ {
		first := portLow + rand.IntN(portHigh-portLow-n)
		if blockFree(first, n) {
			for p := first; p < first+n; p++ {
				portsHanded[p] = true
			}
			return first
		}
	}
	t.Fatalf("no block of %d free ports in [%d,%d)", n, portLow, portHigh)
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
