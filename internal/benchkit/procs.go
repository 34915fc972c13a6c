package benchkit

import (
	"bufio"
	"fmt"
	"log"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StartProc runs bin (a benchmark's broker or proxy process) and waits up
// to 30 s for its "ready X" line; it returns the process and X.
func StartProc(bin string, args ...string) (*exec.Cmd, string) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				ready <- s
			}
		}
	}()
	select {
	case s := <-ready:
		return cmd, s
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		log.Fatalf("%s did not become ready", bin)
	}
	return nil, ""
}

// StopProc stops a process StartProc started: SIGTERM, then SIGKILL after
// 10 s.
func StopProc(cmd *exec.Cmd) {
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// clockTicks is USER_HZ, the unit of utime/stime in /proc/PID/stat; it is
// 100 on every Linux ABI Go supports.
const clockTicks = 100

// ProcCPU is the user+system CPU time process pid has used so far.
func ProcCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		log.Fatal(err)
	}
	// The command name (field 2) may hold spaces; fields after ')' are fixed.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// Median is the median of v (0 for none).
func Median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
