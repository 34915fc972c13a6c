// Package testkit holds what several packages' tests share to run real
// parts as processes, started in one way everywhere: the rtproxy binary
// (RtproxyBinary, StartProxy) and test/kfakebroker (KfakeBinary,
// StartKfakeWith, StartKfake), built once per test binary, on free ports,
// as child processes that die with the test binary. Only tests import it;
// it imports only the standard library.
package testkit

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// StartKfake runs a 3-broker kfake in its own process with the extra
// kfakebroker flags args, on ports the kernel picks, waits until it listens,
// and returns its broker addresses and the process (for tests that kill and
// Wait for it themselves). Its stderr goes to the test binary's. The process
// gets SIGTERM, then SIGKILL after 5s, when the test ends. StartKfakeWith
// starts a broker that can be stopped and restarted on the same ports.
func StartKfake(t testing.TB, args ...string) ([]string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(KfakeBinary(t), append([]string{"-brokers", "3"}, args...)...)
	cmd.SysProcAttr = ChildAttr()
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "ready ") {
				ready <- strings.TrimPrefix(l, "ready ")
			}
		}
	}()
	select {
	case a := <-ready:
		return strings.Split(a, ","), cmd
	case <-time.After(20 * time.Second):
		t.Fatal("kfakebroker did not print ready within 20s")
	}
	return nil, nil
}

// KfakeOpts configures a kfake broker process started by StartKfakeWith.
type KfakeOpts struct {
	Brokers int            // default 3
	Ports   []int          // default: picked free ports, one per broker
	DataDir string         // persist here so Restart keeps data; empty = in memory
	Topics  map[string]int // created up front: name → partitions
	SASL    string         // "MECH:USER:PASS" enables SASL with that superuser
}

// Kfake is a running test/kfakebroker process.
type Kfake struct {
	Addrs []string
	Opts  KfakeOpts

	t    testing.TB
	bin  string
	run  current
	logs *logBuf
}

// StartKfakeWith starts kfake in its own process on fixed ports and waits
// for its ready line (15s). The process is killed when the test ends; the
// test's log then shows its output if the test failed.
func StartKfakeWith(t testing.TB, o KfakeOpts) *Kfake {
	t.Helper()
	if o.Brokers == 0 {
		o.Brokers = 3
	}
	if len(o.Ports) == 0 {
		o.Ports = FreePorts(t, o.Brokers)
	}
	if len(o.Ports) != o.Brokers {
		t.Fatalf("StartKfake: %d ports for %d brokers", len(o.Ports), o.Brokers)
	}
	k := &Kfake{Opts: o, t: t, bin: KfakeBinary(t), logs: &logBuf{}}
	for _, p := range o.Ports {
		k.Addrs = append(k.Addrs, fmt.Sprintf("127.0.0.1:%d", p))
	}
	k.start()
	t.Cleanup(func() {
		k.Kill()
		if t.Failed() {
			t.Logf("kfake output:\n%s", k.Logs())
		}
	})
	return k
}

func (k *Kfake) args() []string {
	o := k.Opts
	ps := make([]string, len(o.Ports))
	for i, p := range o.Ports {
		ps[i] = strconv.Itoa(p)
	}
	args := []string{"-brokers", strconv.Itoa(o.Brokers), "-ports", strings.Join(ps, ",")}
	if o.DataDir != "" {
		args = append(args, "-data-dir", o.DataDir)
	}
	if len(o.Topics) > 0 {
		var ts []string
		for name, n := range o.Topics {
			ts = append(ts, fmt.Sprintf("%s:%d", name, n))
		}
		sort.Strings(ts)
		args = append(args, "-topics", strings.Join(ts, ","))
	}
	if o.SASL != "" {
		args = append(args, "-sasl", o.SASL)
	}
	return args
}

func (k *Kfake) start() {
	k.t.Helper()
	// A restart can race the kernel releasing the old listeners.
	k.run.set(startReady(k.t, "kfake", k.bin, k.args(), k.logs))
}

// Stop sends SIGTERM and waits for the process to exit (SIGKILL after 10s).
func (k *Kfake) Stop() {
	if c := k.run.take(); c != nil {
		c.stop(syscall.SIGTERM, 10*time.Second)
	}
}

// Kill sends SIGKILL and waits for the process to exit.
func (k *Kfake) Kill() {
	if c := k.run.take(); c != nil {
		c.stop(syscall.SIGKILL, 10*time.Second)
	}
}

// Restart stops a running broker (SIGTERM) if needed and starts it again on
// the same ports and data dir.
func (k *Kfake) Restart() {
	k.t.Helper()
	k.Stop()
	k.start()
}

// Logs returns everything the process printed so far.
func (k *Kfake) Logs() string { return k.logs.String() }
