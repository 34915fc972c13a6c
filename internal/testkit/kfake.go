// Package testkit holds what several packages' tests share to run real
// parts: test/kfakebroker as its own process, and child processes that die
// with the test binary. Only tests import it; it imports only the standard
// library.
package testkit

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var kfake struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// KfakeBinary builds test/kfakebroker once per test binary and returns its
// path. Call Cleanup from TestMain to remove it.
func KfakeBinary(t testing.TB) string {
	t.Helper()
	kfake.once.Do(func() {
		kfake.dir, kfake.err = os.MkdirTemp("", "rtproxy-kfake-")
		if kfake.err != nil {
			return
		}
		kfake.bin = filepath.Join(kfake.dir, "kfakebroker")
		out, err := exec.Command("go", "build", "-o", kfake.bin, "github.com/rtproxy/rtproxy/test/kfakebroker").CombinedOutput()
		if err != nil {
			kfake.err = fmt.Errorf("go build kfakebroker: %v\n%s", err, out)
		}
	})
	if kfake.err != nil {
		t.Fatal(kfake.err)
	}
	return kfake.bin
}

// Cleanup removes what KfakeBinary built.
func Cleanup() {
	if kfake.dir != "" {
		os.RemoveAll(kfake.dir)
	}
}

// StartKfake runs a 3-broker kfake in its own process with the extra
// kfakebroker flags args, waits until it listens, and returns its broker
// addresses and the process (for tests that kill it). The process gets
// SIGTERM, then SIGKILL after 5s, when the test ends.
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
