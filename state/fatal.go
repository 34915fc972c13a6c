package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBroken is returned by every write once pebble has reported a fatal
// error (a WAL or MANIFEST write that failed: a full or failing disk).
// Pebble's commit pipeline is unusable after one, so the database stays
// broken until the process restarts; the last checkpoint on disk is
// intact, and recovery starts from it.
var ErrBroken = errors.New("state: the state store failed")

// fatalGuard turns pebble's fatal errors into ErrBroken instead of a
// process exit. Pebble reports them through Logger.Fatalf and requires
// that Fatalf not return. On a goroutine inside one of our writes
// (guard), Fatalf panics with a fatalPanic that the write recovers into
// ErrBroken. On one of pebble's own goroutines (a flush or a compaction)
// nothing could recover the panic, so Fatalf parks that goroutine for
// good instead: the database is marked broken first, every later write
// fails fast, and the proxy goes on forwarding.
type fatalGuard struct {
	log    *slog.Logger
	broken atomic.Pointer[error]
	inside sync.Map // goroutine id -> struct{}: goroutines inside guard
	// onBroken is called once, when the database breaks (DB.OnBroken).
	onBroken atomic.Pointer[func(error)]

	infoMu      sync.Mutex
	infoLast    map[string]time.Time // format -> when last logged
	infoSkipped map[string]int       // format -> repeats left out since
}

type fatalPanic struct{ err error }

// err is ErrBroken with pebble's message once the database is broken.
func (g *fatalGuard) err() error {
	if p := g.broken.Load(); p != nil {
		return *p
	}
	return nil
}

// Fatalf implements pebble's Logger.
func (g *fatalGuard) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	err := fmt.Errorf("%w: %s", ErrBroken, msg)
	if g.broken.CompareAndSwap(nil, &err) {
		if fn := g.onBroken.Load(); fn != nil {
			(*fn)(err)
		}
	}
	g.log.Error("pebble reported a fatal error; every route with state stops, the proxy goes on",
		"component", "pebble", "err", msg)
	if _, ok := g.inside.Load(goid()); ok {
		panic(fatalPanic{err})
	}
	select {}
}

// Infof implements pebble's Logger. A line pebble repeats is logged at
// most once per infoEvery (see logLimited).
func (g *fatalGuard) Infof(format string, args ...any) {
	g.logLimited(slog.LevelInfo, format, args)
}

// Errorf implements pebble's Logger: the errors pebble goes on after (a
// background flush or compaction that failed and is retried, a metrics
// error). Logged at most once per infoEvery like Infof.
func (g *fatalGuard) Errorf(format string, args ...any) {
	g.logLimited(slog.LevelError, format, args)
}

// logLimited logs one pebble line. A line pebble repeats (a background
// error retried on a full disk: hundreds a second) is logged at most once
// per infoEvery, with how many were left out.
func (g *fatalGuard) logLimited(level slog.Level, format string, args []any) {
	now := time.Now()
	g.infoMu.Lock()
	if g.infoLast == nil {
		g.infoLast = map[string]time.Time{}
		g.infoSkipped = map[string]int{}
	}
	if now.Sub(g.infoLast[format]) < infoEvery {
		g.infoSkipped[format]++
		g.infoMu.Unlock()
		return
	}
	skipped := g.infoSkipped[format]
	g.infoLast[format], g.infoSkipped[format] = now, 0
	g.infoMu.Unlock()
	if skipped > 0 {
		g.log.Log(context.Background(), level, fmt.Sprintf(format, args...), "component", "pebble", "repeats_left_out", skipped)
		return
	}
	g.log.Log(context.Background(), level, fmt.Sprintf(format, args...), "component", "pebble")
}

// infoEvery is how often one pebble log line (by its format) is logged.
const infoEvery = 10 * time.Second

// guard runs op, one pebble write, returning ErrBroken if the database is
// broken or breaks during op.
func (g *fatalGuard) guard(op func() error) (err error) {
	if err := g.err(); err != nil {
		return err
	}
	id := goid()
	g.inside.Store(id, struct{}{})
	defer g.inside.Delete(id)
	defer func() {
		if p := recover(); p != nil {
			f, ok := p.(fatalPanic)
			if !ok {
				panic(p)
			}
			err = f.err
		}
	}()
	return op()
}

// goid is the current goroutine's id, from the first line of its stack
// ("goroutine 123 [running]:"). It costs a microsecond or two; guard runs
// once per write batch, never per record.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseInt(string(b), 10, 64)
	return id
}
