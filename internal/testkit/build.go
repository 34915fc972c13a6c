package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// A build is one `go build` of a package of this module, started once per
// test binary and awaited by every test that needs its output.
type build struct {
	done chan struct{}
	path string
	err  error
}

var builds struct {
	mu  sync.Mutex
	dir string
	m   map[string]*build // package and build flags → build
}

// startBuild starts building pkg (a path relative to the module root) with
// the go build flags args into a file named name, unless the same build was
// started before, and returns it.
func startBuild(pkg, name string, args []string) *build {
	key := strings.Join(append([]string{pkg}, args...), "\x00")
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if b := builds.m[key]; b != nil {
		return b
	}
	if builds.m == nil {
		builds.m = map[string]*build{}
	}
	b := &build{done: make(chan struct{})}
	builds.m[key] = b
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "rtproxy-testkit-bin-")
		if err != nil {
			b.err = err
			close(b.done)
			return b
		}
		builds.dir = dir
	}
	// Its own directory, so that the file keeps the command's name.
	b.path = filepath.Join(builds.dir, strconv.Itoa(len(builds.m)), name)
	go func() {
		defer close(b.done)
		b.err = goBuild(pkg, b.path, args)
	}()
	return b
}

func goBuild(pkg, out string, args []string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	cmd := exec.Command(goCommand(), append(append([]string{"build"}, args...), "-o", out, pkg)...)
	cmd.Dir = root
	cmd.SysProcAttr = ChildAttr()
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(append(args, pkg), " "), err, b)
	}
	return nil
}

// wait returns the built file, or fails the test with the build's output.
func (b *build) wait(t testing.TB, name string) string {
	t.Helper()
	<-b.done
	if b.err != nil {
		t.Fatalf("binary %s unavailable: %v", name, b.err)
	}
	return b.path
}

// RtproxyBinary builds cmd/rtproxy with the go build flags buildArgs (none,
// or for instance "-ldflags", "-X main.version=v0") once per test binary
// and set of flags, and returns its path. Call Cleanup from TestMain to
// remove it.
func RtproxyBinary(t testing.TB, buildArgs ...string) string {
	t.Helper()
	return startBuild("./cmd/rtproxy", "rtproxy", buildArgs).wait(t, "rtproxy")
}

// KfakeBinary builds test/kfakebroker once per test binary and returns its
// path. Call Cleanup from TestMain to remove it.
func KfakeBinary(t testing.TB) string {
	t.Helper()
	return startBuild("./test/kfakebroker", "kfakebroker", nil).wait(t, "kfakebroker")
}

// Prebuild starts building test/kfakebroker and cmd/rtproxy (with the go
// build flags rtproxyBuildArgs) in the background, so that the two builds
// overlap; KfakeBinary and RtproxyBinary then wait for them. A failed build
// fails only the tests that ask for that binary.
func Prebuild(rtproxyBuildArgs ...string) {
	startBuild("./test/kfakebroker", "kfakebroker", nil)
	startBuild("./cmd/rtproxy", "rtproxy", rtproxyBuildArgs)
}

// Cleanup waits for the builds started and removes what they built. Call it
// from TestMain after m.Run.
func Cleanup() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	for _, b := range builds.m {
		<-b.done
	}
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	builds.dir, builds.m = "", nil
}

// ModuleRoot walks up from the working directory to the folder holding go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("getwd: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// goCommand is the go command of the toolchain running the tests.
func goCommand() string {
	goBin := filepath.Join(goroot(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		return "go"
	}
	return goBin
}

func goroot() string {
	if r := os.Getenv("GOROOT"); r != "" {
		return r
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "/usr/local/go"
	}
	return strings.TrimSpace(string(out))
}
