package state

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestFatalDiskErrorBreaksTheStoreNotTheProcess: a write-ahead log that
// cannot be written (a full disk) is a fatal error for pebble, which it
// reports through Logger.Fatalf. It used to panic and take the proxy
// down with every route. Now the write returns ErrBroken, every later
// write fails fast with it, and the process goes on (issue 10).
func TestFatalDiskErrorBreaksTheStoreNotTheProcess(t *testing.T) {
	var full atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.HasSuffix(op.Path, ".log") {
			return syscall.ENOSPC
		}
		return nil
	}))
	db, err := OpenWithOptions("db", nil, Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	kv := db.Namespace("r", "s")
	commit := func(k string) error {
		if err := kv.Set([]byte(k), []byte("v")); err != nil {
			return err
		}
		fz, err := db.Freeze("r")
		if err != nil {
			return err
		}
		return fz.Commit(map[int32]int64{0: 1}, nil)
	}
	if err := commit("a"); err != nil {
		t.Fatalf("a checkpoint before the disk fills: %v", err)
	}
	if db.Broken() != nil {
		t.Fatalf("broken before any error: %v", db.Broken())
	}

	var told []error
	db.OnBroken(func(err error) { told = append(told, err) })
	full.Store(true)
	err = commit("b")
	if !errors.Is(err, ErrBroken) {
		t.Fatalf("checkpoint on a full disk: %v, want ErrBroken", err)
	}
	if !strings.Contains(err.Error(), "no space left") {
		t.Errorf("the error does not say why: %v", err)
	}
	if !errors.Is(db.Broken(), ErrBroken) {
		t.Errorf("Broken() = %v after a fatal error", db.Broken())
	}
	if len(told) != 1 || !errors.Is(told[0], ErrBroken) {
		t.Errorf("OnBroken was told %v, want ErrBroken once", told)
	}
	if err := db.PutDurable("r", "s", []byte("x")); !errors.Is(err, ErrBroken) {
		t.Errorf("a later write: %v, want ErrBroken at once", err)
	}
	// Reads still answer from what pebble holds.
	if v, ok, err := kv.Get([]byte("a")); err != nil || !ok || string(v) != "v" {
		t.Errorf("read after the failure: %q %v %v", v, ok, err)
	}
	if err := db.Close(); !errors.Is(err, ErrBroken) {
		t.Errorf("Close: %v, want ErrBroken (pebble is not closed, it could hang)", err)
	}
}

// TestPebbleInfoRepeatsRateLimited: a line pebble repeats (a background
// error retried on a full disk, hundreds a second) is logged once per
// infoEvery, the next time with how many were left out; other lines are
// not held back by it (found by make soak: 800 lines per fill).
func TestPebbleInfoRepeatsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	g := &fatalGuard{log: slog.New(slog.NewTextHandler(&buf, nil))}
	for i := range 500 {
		g.Infof("background error: %d", i)
	}
	g.Infof("flushed %d", 1)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "background error: 0") || !strings.Contains(lines[1], "flushed 1") {
		t.Fatalf("logged:\n%s", buf.String())
	}
	g.infoLast["background error: %d"] = time.Now().Add(-infoEvery)
	g.Infof("background error: %d", 500)
	if last := buf.String(); !strings.Contains(last, "background error: 500") || !strings.Contains(last, "repeats_left_out=499") {
		t.Fatalf("after the interval:\n%s", last)
	}
}
