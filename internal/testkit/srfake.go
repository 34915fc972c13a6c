package testkit

import (
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// SrfakeBinary builds test/srfakebroker once per test binary and returns
// its path.
func SrfakeBinary(t testing.TB) string {
	t.Helper()
	return startBuild("./test/srfakebroker", "srfakebroker", nil).wait(t, "srfakebroker")
}

// Registry is a running test/srfakebroker process: franz-go's srfake schema
// registry on a fixed loopback port, its schemas kept in a file so that a
// restart keeps them.
type Registry struct {
	URL  string
	Auth string // the Authorization header it requires; empty: none

	t     testing.TB
	bin   string
	port  int
	state string
	run   current
	logs  *logBuf
}

// StartRegistry starts a schema registry in its own process and waits for
// it to listen (15s). auth, when not empty, is the Authorization header it
// requires (e.g. "Bearer t0k3n"). It is killed when the test ends.
func StartRegistry(t testing.TB, auth string) *Registry {
	t.Helper()
	r := &Registry{t: t, bin: SrfakeBinary(t), port: FreePorts(t, 1)[0], Auth: auth,
		state: filepath.Join(t.TempDir(), "schemas.json"), logs: &logBuf{}}
	r.URL = "http://127.0.0.1:" + strconv.Itoa(r.port)
	r.start()
	t.Cleanup(func() {
		r.Stop()
		if t.Failed() {
			t.Logf("srfakebroker output:\n%s", r.logs.String())
		}
	})
	return r
}

func (r *Registry) start() {
	t := r.t
	t.Helper()
	args := []string{"-port", strconv.Itoa(r.port), "-state", r.state}
	if r.Auth != "" {
		args = append(args, "-auth", r.Auth)
	}
	// A restart can race the kernel releasing the old listener.
	r.run.set(startReady(t, "srfakebroker", r.bin, args, r.logs))
}

// Stop ends the registry (SIGTERM, SIGKILL after 5s): requests to it are
// refused until Restart.
func (r *Registry) Stop() {
	if c := r.run.take(); c != nil {
		c.stop(syscall.SIGTERM, 5*time.Second)
	}
}

// Restart starts a stopped registry again on the same port, with the
// schemas it held.
func (r *Registry) Restart() {
	r.t.Helper()
	r.Stop()
	r.start()
}
