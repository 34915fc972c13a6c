package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `rtproxy check` refuses `delivery: exactly_once` on an HTTP sink, and
// accepts the same route at least once when the config allows its URL.
func TestCheckHTTPSinkExactlyOnce(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "rtproxy.yaml")
	if err := os.WriteFile(cfg, []byte("rules:\n  allow:\n    urls: [\"https://hooks.example.com\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(delivery string) {
		body := "route: hook\nsource: { topic: orders }\nsink:\n  http: { url: https://hooks.example.com/orders }\n  delivery: " + delivery + "\n"
		if err := os.WriteFile(filepath.Join(dir, "hook.yaml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("exactly_once")
	var out, errOut bytes.Buffer
	if code := cmdCheck([]string{"--config", cfg, dir}, &out, &errOut); code != 1 {
		t.Fatalf("exit %d, want 1:\n%s%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "hook.yaml:5:13: `sink.delivery: exactly_once` needs a topic sink") {
		t.Errorf("output:\n%s%s", out.String(), errOut.String())
	}
	write("at_least_once")
	out.Reset()
	errOut.Reset()
	if code := cmdCheck([]string{"--config", cfg, dir}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d, want 0:\n%s%s", code, out.String(), errOut.String())
	}
}
