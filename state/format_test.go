package state

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// The fixtures under testdata/pebblev1 were written by rtproxy's state
// package on pebble v1.1.5 (commit b93fe2f, the program in gen.go.txt):
// route "payments" with three keys in step "1-dedup-0a0b0c0d", a durable
// record and a checkpoint at offsets {0: 42, 1: 7}. format1 is the
// directory as that build left it (pebble v1's default format,
// FormatMostCompatible); upgraded is a copy after
//
//	echo y | go run github.com/cockroachdb/pebble/cmd/pebble@v1.1.5 db upgrade DIR
//
// (format major version 16), the upgrade the refusal's message offers.

// copyFixture copies testdata/pebblev1/name to a temporary directory
// (opening a store writes to it) and returns that directory.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("testdata", "pebblev1", name)
	dst := filepath.Join(t.TempDir(), name)
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	return dst
}

// dirContents maps every file name of dir to its contents.
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(b)
	}
	return m
}

// TestOpenRefusesPebbleV1Directory: a state directory written by rtproxy on
// pebble v1 is refused with ErrOldFormat and a message that says how to
// upgrade it or what starting empty costs; the directory is left as it was.
func TestOpenRefusesPebbleV1Directory(t *testing.T) {
	dir := copyFixture(t, "format1")
	before := dirContents(t, dir)
	db, err := Open(dir, nil)
	if err == nil {
		db.Close()
		t.Fatal("Open of a pebble v1 directory succeeded, want ErrOldFormat")
	}
	if !errors.Is(err, ErrOldFormat) {
		t.Fatalf("err = %v, want ErrOldFormat", err)
	}
	for _, want := range []string{dir, "format major version 1,", "reads 13 and later",
		"echo y | go run github.com/cockroachdb/pebble/cmd/pebble@v1.1.5 db upgrade " + dir,
		"restores its keyed state from its changelog topics"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q\ndoes not say %q", err, want)
		}
	}
	if after := dirContents(t, dir); !maps.Equal(before, after) {
		t.Errorf("the refused directory changed: before %d files, after %d", len(before), len(after))
	}
}

// TestOpenUpgradedPebbleV1Directory: the same directory after pebble v1's
// upgrade opens with everything in it (checkpoint, keyed state, durable
// record), is ratcheted to storeFormat, and takes checkpoints again.
func TestOpenUpgradedPebbleV1Directory(t *testing.T) {
	dir := copyFixture(t, "upgraded")
	db := openTest(t, dir)
	if got := db.pdb.FormatMajorVersion(); got != storeFormat {
		t.Errorf("format major version after open = %d, want %d", got, storeFormat)
	}
	check := func(db *DB, wantOffs map[int32]int64) {
		t.Helper()
		cp, ok, err := db.LoadCheckpoint("payments")
		if err != nil || !ok {
			t.Fatalf("LoadCheckpoint: ok=%v err=%v", ok, err)
		}
		if !maps.Equal(cp.Offsets, wantOffs) {
			t.Errorf("offsets = %v, want %v", cp.Offsets, wantOffs)
		}
		kv := db.Namespace("payments", "1-dedup-0a0b0c0d")
		for _, k := range []string{"k1", "k2", "k3"} {
			v, ok, err := kv.Get([]byte(k))
			if err != nil || !ok || string(v) != "v-"+k {
				t.Errorf("Get(%s) = %q ok=%v err=%v, want %q", k, v, ok, err, "v-"+k)
			}
		}
		v, ok, err := db.GetDurable("payments", "kafka")
		if err != nil || !ok || string(v) != "group=g1" {
			t.Errorf("durable record = %q ok=%v err=%v", v, ok, err)
		}
	}
	check(db, map[int32]int64{0: 42, 1: 7})
	if err := db.Namespace("payments", "1-dedup-0a0b0c0d").Set([]byte("k4"), []byte("v-k4")); err != nil {
		t.Fatal(err)
	}
	if err := db.Checkpoint("payments", map[int32]int64{0: 50, 1: 9}, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTest(t, dir)
	defer db.Close()
	check(db, map[int32]int64{0: 50, 1: 9})
	if v, ok, _ := db.Namespace("payments", "1-dedup-0a0b0c0d").Get([]byte("k4")); !ok || string(v) != "v-k4" {
		t.Errorf("k4 after reopen = %q ok=%v", v, ok)
	}
}

// TestCheckOldFormat: the directories checkOldFormat refuses and lets
// through, by their file names alone.
func TestCheckOldFormat(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		vers  int // -1: accepted
	}{
		{"absent", nil, -1},
		{"empty", []string{}, -1},
		{"v1 default", []string{"CURRENT", "MANIFEST-000001", "000002.log"}, 1},
		{"v1 format 12", []string{"CURRENT", "marker.format-version.000003.012", "marker.manifest.000001.MANIFEST-000004"}, 12},
		{"v1 upgraded", []string{"CURRENT", "marker.format-version.000015.016", "marker.manifest.000001.MANIFEST-000006"}, -1},
		{"v2", []string{"marker.format-version.000002.024", "marker.manifest.000001.MANIFEST-000001", "000002.log"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			if tc.files != nil {
				if err := fs.MkdirAll("db", 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range tc.files {
				f, err := fs.Create(filepath.Join("db", name), vfs.WriteCategoryUnspecified)
				if err != nil {
					t.Fatal(err)
				}
				f.Close()
			}
			err := checkOldFormat(fs, "db")
			if tc.vers < 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrOldFormat) {
				t.Fatalf("err = %v, want ErrOldFormat", err)
			}
			if want := "format major version " + strconv.Itoa(tc.vers) + ","; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		})
	}
	if pebble.FormatMinSupported != 13 {
		t.Errorf("pebble.FormatMinSupported = %d: the refusal's message and the tests assume 13", pebble.FormatMinSupported)
	}
}

// FuzzCheckOldFormat: any directory listing is accepted or refused with
// ErrOldFormat, never anything else, and never a panic.
func FuzzCheckOldFormat(f *testing.F) {
	f.Add("CURRENT", "marker.format-version.000001.012")
	f.Add("CURRENT", "marker.format-version.000015.016")
	f.Add("000002.log", "marker.format-version.x.")
	f.Add("marker.format-version.", "marker.format-version.1.99999999999999999999")
	f.Fuzz(func(t *testing.T, a, b string) {
		fs := vfs.NewMem()
		if err := fs.MkdirAll("db", 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{a, b} {
			if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
				continue
			}
			fl, err := fs.Create(filepath.Join("db", name), vfs.WriteCategoryUnspecified)
			if err != nil {
				continue
			}
			fl.Close()
		}
		if err := checkOldFormat(fs, "db"); err != nil && !errors.Is(err, ErrOldFormat) {
			t.Fatalf("listing %q, %q: %v", a, b, err)
		}
	})
}
