package testkit

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// logBuf is a goroutine-safe buffer for a child process's output.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lineWriter hands every complete line written to it, without its newline,
// to line.
type lineWriter struct {
	line func(string)
	part []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.line(string(w.part[:i]))
		w.part = w.part[i+1:]
	}
}

// child is one run of a process that dies with the test binary (ChildAttr);
// a goroutine waits for it and closes done when it has exited.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startChild starts bin with args and env (nil: inherit the environment),
// its output going to stdout and stderr.
func startChild(bin string, args, env []string, stdout, stderr io.Writer) (*child, error) {
	return startChildIn("", bin, args, env, stdout, stderr)
}

// startChildIn is startChild with the working directory dir ("": this
// process's).
func startChildIn(dir, bin string, args, env []string, stdout, stderr io.Writer) (*child, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = ChildAttr()
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(c.done) }()
	return c, nil
}

// exited reports whether the process has exited.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop sends sig and waits up to grace for the exit; then it kills the
// process and waits. It reports whether the process exited within grace.
func (c *child) stop(sig os.Signal, grace time.Duration) bool {
	c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
		return true
	case <-time.After(grace):
		c.cmd.Process.Kill()
		<-c.done
		return false
	}
}

// kill sends SIGKILL and waits for the exit.
func (c *child) kill() {
	c.cmd.Process.Kill()
	<-c.done
}

// exitCode is the exit status, -1 when a signal ended the process.
func (c *child) exitCode() int { return c.cmd.ProcessState.ExitCode() }

// current holds the running child of a restartable process.
type current struct {
	mu sync.Mutex
	c  *child
}

func (r *current) set(c *child) {
	r.mu.Lock()
	r.c = c
	r.mu.Unlock()
}

func (r *current) get() *child {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.c
}

// take returns the running child and forgets it (nil when none runs).
func (r *current) take() *child {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.c
	r.c = nil
	return c
}

// startReady starts bin and waits until it prints a line starting with
// "ready " (test/kfakebroker, test/srfakebroker), copying its output to
// logs. A child that exits first is started again (a restart can race the
// kernel releasing the old listeners), 20 times at most.
func startReady(t testing.TB, name, bin string, args []string, logs *logBuf) *child {
	t.Helper()
	var lastErr error
	for range 20 {
		ready := make(chan struct{}, 1)
		stdout := &lineWriter{line: func(line string) {
			logs.Write([]byte(line + "\n"))
			if strings.HasPrefix(line, "ready ") {
				select {
				case ready <- struct{}{}:
				default:
				}
			}
		}}
		c, err := startChild(bin, args, nil, stdout, logs)
		if err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		select {
		case <-ready:
			return c
		case <-c.done:
			lastErr = fmt.Errorf("%s exited before ready: %s", name, logs.String())
			time.Sleep(100 * time.Millisecond)
		case <-time.After(15 * time.Second):
			c.kill()
			t.Fatalf("%s not ready after 15s; output:\n%s", name, logs.String())
		}
	}
	t.Fatalf("%v", lastErr)
	return nil
}
