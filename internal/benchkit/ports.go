package benchkit

import (
	"log"
	"net"
	"os"
	"strconv"
)

// FreeAddr is a free loopback address (127.0.0.1:PORT) for a benchmark's
// own listener.
func FreeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// FreePortBlock finds n consecutive free loopback ports below the kernel's
// ephemeral range (a proxy's per-broker listeners) and returns the first.
func FreePortBlock(n int) int {
	for base := 21000 + os.Getpid()%5000; base+n <= 32000; base += n {
		var ls []net.Listener
		ok := true
		for p := base; p < base+n; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return base
		}
	}
	log.Fatal("no free port block")
	return 0
}
