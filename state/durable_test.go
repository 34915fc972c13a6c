package state

import (
	"io"
	"log/slog"
	"testing"
)

// TestDurableRecord: a durable record is readable after a reopen without
// any checkpoint, survives Discard (no rollback), is replaced by the next
// PutDurable, and is deleted with its step by DropStepsExcept.
func TestDurableRecord(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	db, err := Open(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := db.GetDurable("r", "s1"); err != nil || ok {
		t.Fatalf("empty db: ok=%v err=%v, want none", ok, err)
	}
	kv := db.Namespace("r", "s1")
	if err := kv.Set([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := db.PutDurable("r", "s1", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := db.PutDurable("r", "s1", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if err := db.PutDurable("r", "s2", []byte("other")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Discard("r"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	v, ok, err := db.GetDurable("r", "s1")
	if err != nil || !ok || string(v) != "two" {
		t.Fatalf("after reopen: %q ok=%v err=%v, want \"two\"", v, ok, err)
	}
	if _, ok, _ := db.Namespace("r", "s1").Get([]byte("k")); ok {
		t.Fatal("uncheckpointed KV write survived the reopen")
	}
	if err := db.DropStepsExcept("r", []string{"s2"}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := db.GetDurable("r", "s1"); err != nil || ok {
		t.Fatalf("dropped step: ok=%v err=%v, want none", ok, err)
	}
	if v, ok, err := db.GetDurable("r", "s2"); err != nil || !ok || string(v) != "other" {
		t.Fatalf("kept step: %q ok=%v err=%v, want \"other\"", v, ok, err)
	}
	if err := db.DropRoute("r"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := db.GetDurable("r", "s2"); err != nil || ok {
		t.Fatalf("dropped route: ok=%v err=%v, want none", ok, err)
	}
}
