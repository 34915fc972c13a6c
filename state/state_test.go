package state

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs testdata/kv_*: one database per file, on which each
// `ops` block applies its lines in order and prints what the reading ops
// return. The current route is "r" until `route NAME` changes it.
//
//	set STEP KEY VAL          del STEP KEY
//	get STEP KEY              scan STEP [START [END|-]]
//	freeze                    → names the cut F1, F2, …
//	commit FN [P=OFF…] [snap:STEP=K:V,K:V…]
//	checkpoint [P=OFF…] [snap:STEP=K:V,…]
//	crash                     → close without checkpoint, reopen
//	load [STEP…]              → last checkpoint (seq, offsets, snapshots)
//	drop-route                drop-except [STEP…]
//	discard                   → drop uncommitted writes and frozen cuts
//	routes                    pending
//	forget                    → drop held KV handles (as a restarted step would)
func TestDataDriven(t *testing.T) {
	ran := 0
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if !strings.HasPrefix(pathBase(path), "kv_") || strings.Contains(path, "/fuzz/") {
			t.Skip()
		}
		ran++
		h := &ddHarness{t: t, dir: t.TempDir(), route: "r", frozen: map[string]*Frozen{}}
		h.open()
		defer func() { h.db.Close() }()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "ops" {
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			var out strings.Builder
			for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
				if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
					continue
				}
				h.apply(&out, line)
			}
			return out.String()
		})
	})
	if ran == 0 {
		t.Fatal("no data-driven test files ran: testdata is missing them or the name filter matches none")
	}
}

func pathBase(p string) string { return p[strings.LastIndex(p, "/")+1:] }

type ddHarness struct {
	t       *testing.T
	dir     string
	db      *DB
	route   string
	frozen  map[string]*Frozen
	nFrozen int
	// kvs holds the KV handles in use, as a step would; `forget` drops
	// them so that the next use asks the DB again.
	kvs map[[2]string]KV
}

func (h *ddHarness) kv(step string) KV {
	k := [2]string{h.route, step}
	if h.kvs[k] == nil {
		h.kvs[k] = h.db.Namespace(h.route, step)
	}
	return h.kvs[k]
}

func (h *ddHarness) open() {
	db, err := Open(h.dir, slog.New(slog.DiscardHandler))
	if err != nil {
		h.t.Fatal(err)
	}
	h.db = db
	h.kvs = map[[2]string]KV{}
}

func (h *ddHarness) apply(out *strings.Builder, line string) {
	f := strings.Fields(line)
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	errLine := func(err error) {
		if err != nil {
			fmt.Fprintf(out, "%s: error: %v\n", line, err)
		}
	}
	switch f[0] {
	case "route":
		h.route = arg(1)
	case "set":
		errLine(h.kv(arg(1)).Set([]byte(arg(2)), []byte(arg(3))))
	case "del":
		errLine(h.kv(arg(1)).Delete([]byte(arg(2))))
	case "get":
		v, ok, err := h.kv(arg(1)).Get([]byte(arg(2)))
		switch {
		case err != nil:
			errLine(err)
		case ok:
			fmt.Fprintf(out, "get %s %s: %s\n", arg(1), arg(2), v)
		default:
			fmt.Fprintf(out, "get %s %s: (not found)\n", arg(1), arg(2))
		}
	case "scan":
		var start, end []byte
		if len(f) > 2 {
			start = []byte(arg(2))
		}
		if len(f) > 3 && arg(3) != "-" {
			end = []byte(arg(3))
		}
		var kvs []string
		err := h.kv(arg(1)).Scan(start, end, func(k, v []byte) bool {
			kvs = append(kvs, string(k)+"="+string(v))
			return true
		})
		if err != nil {
			errLine(err)
			return
		}
		fmt.Fprintf(out, "%s: [%s]\n", line, strings.Join(kvs, " "))
	case "freeze":
		fz, err := h.db.Freeze(h.route)
		if err != nil {
			errLine(err)
			return
		}
		h.nFrozen++
		name := "F" + strconv.Itoa(h.nFrozen)
		h.frozen[name] = fz
		fmt.Fprintf(out, "%s: %d writes\n", name, fz.Writes())
	case "commit":
		fz := h.frozen[arg(1)]
		if fz == nil {
			h.t.Fatalf("%s: no frozen cut %s", line, arg(1))
		}
		offs, snaps := parseCheckpointArgs(h.t, f[2:])
		errLine(fz.Commit(offs, snaps))
	case "checkpoint":
		offs, snaps := parseCheckpointArgs(h.t, f[1:])
		errLine(h.db.Checkpoint(h.route, offs, snaps))
	case "crash":
		if err := h.db.Close(); err != nil {
			h.t.Fatal(err)
		}
		h.frozen = map[string]*Frozen{}
		h.open()
	case "load":
		cp, ok, err := h.db.LoadCheckpoint(h.route)
		if err != nil {
			errLine(err)
			return
		}
		if !ok {
			fmt.Fprintf(out, "no checkpoint\n")
			return
		}
		fmt.Fprintf(out, "checkpoint seq=%d offsets=%s\n", cp.Seq, formatOffsets(cp.Offsets))
		for _, step := range f[1:] {
			var kvs []string
			errLine(cp.Snapshot(step).Each(func(k, v []byte) error {
				kvs = append(kvs, string(k)+"="+string(v))
				return nil
			}))
			fmt.Fprintf(out, "snapshot %s: [%s]\n", step, strings.Join(kvs, " "))
		}
	case "drop-route":
		errLine(h.db.DropRoute(h.route))
	case "discard":
		cuts, n, err := h.db.Discard(h.route)
		if err != nil {
			errLine(err)
			return
		}
		fmt.Fprintf(out, "discarded %s: %d frozen cuts, %d bytes\n", h.route, cuts, n)
	case "drop-except":
		errLine(h.db.DropStepsExcept(h.route, f[1:]))
	case "routes":
		infos, err := h.db.Routes()
		if err != nil {
			errLine(err)
			return
		}
		for _, in := range infos {
			fmt.Fprintf(out, "route %s: seq=%d keys=%d bytes=%d checkpointed=%t\n", in.Route, in.Seq, in.Keys, in.Bytes, !in.LastCheckpoint.IsZero())
			for _, s := range in.Steps {
				fmt.Fprintf(out, "  step %s: kv=%d/%dB snap=%d/%dB\n", s.Step, s.KVKeys, s.KVBytes, s.SnapKeys, s.SnapBytes)
			}
		}
		if len(infos) == 0 {
			fmt.Fprintf(out, "no routes\n")
		}
	case "forget":
		h.kvs = map[[2]string]KV{}
	case "pending":
		fmt.Fprintf(out, "pending %s: %d bytes\n", h.route, h.db.PendingBytes(h.route))
	default:
		h.t.Fatalf("unknown op %q", line)
	}
}

func parseCheckpointArgs(t *testing.T, args []string) (map[int32]int64, map[string]func(Writer) error) {
	offs := map[int32]int64{}
	snaps := map[string]func(Writer) error{}
	for _, a := range args {
		if rest, ok := strings.CutPrefix(a, "snap:"); ok {
			step, list, _ := strings.Cut(rest, "=")
			snaps[step] = func(w Writer) error {
				if list == "" {
					return nil
				}
				if list == "FAIL" {
					return fmt.Errorf("snapshot refused")
				}
				for _, kv := range strings.Split(list, ",") {
					k, v, _ := strings.Cut(kv, ":")
					if err := w.Put([]byte(k), []byte(v)); err != nil {
						return err
					}
				}
				return nil
			}
			continue
		}
		ps, os, ok := strings.Cut(a, "=")
		p, err1 := strconv.ParseInt(ps, 10, 32)
		o, err2 := strconv.ParseInt(os, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("bad offset %q", a)
		}
		offs[int32(p)] = o
	}
	return offs, snaps
}

func formatOffsets(m map[int32]int64) string {
	parts := slices.Sorted(maps.Keys(m))
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = fmt.Sprintf("%d:%d", p, m[p])
	}
	return "{" + strings.Join(s, " ") + "}"
}
