package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/config"
)

func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestOperationsDocCoversConfig keeps docs/OPERATIONS.md's table in step
// with the config: every key, its environment variable and its flag.
func TestOperationsDocCoversConfig(t *testing.T) {
	doc := readRepoFile(t, "docs/OPERATIONS.md")
	flagOf := map[string]string{}
	for _, f := range runFlags {
		flagOf[f.key] = f.flag
	}
	for _, k := range config.Keys() {
		row := "| `" + k.Path + "` | "
		i := strings.Index(doc, row)
		if i < 0 {
			t.Errorf("docs/OPERATIONS.md has no table row for %s", k.Path)
			continue
		}
		line := doc[i : i+strings.Index(doc[i:], "\n")]
		if !strings.Contains(line, "`"+k.Env+"`") {
			t.Errorf("row %s does not name %s", k.Path, k.Env)
		}
		if f, ok := flagOf[k.Path]; ok && !strings.Contains(line, "`--"+f+"`") {
			t.Errorf("row %s does not name --%s", k.Path, f)
		}
	}
}

// TestCIRunsTheREADMETestCommand: .ci/run calls exactly the command the
// README gives as the test command.
func TestCIRunsTheREADMETestCommand(t *testing.T) {
	readme := readRepoFile(t, "README.md")
	if !strings.Contains(readme, "```sh\nmake test\n```") {
		t.Fatal("README does not give `make test` as the test command")
	}
	ci := readRepoFile(t, ".ci/run")
	var cmds []string
	for _, l := range strings.Split(ci, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "set ") || strings.HasPrefix(l, "export ") || strings.HasPrefix(l, "cd ") {
			continue
		}
		cmds = append(cmds, l)
	}
	if len(cmds) != 1 || cmds[0] != "make test" {
		t.Fatalf(".ci/run runs %q, want exactly [make test]", cmds)
	}
}

// readmeBlock returns the first ```sh block after marker in the README.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	readme := readRepoFile(t, "README.md")
	i := strings.Index(readme, marker)
	if i < 0 {
		t.Fatalf("README lost %q", marker)
	}
	block := readme[i:]
	start := strings.Index(block, "```sh\n") + len("```sh\n")
	return block[start : start+strings.Index(block[start:], "```")]
}

// runREADMEBlock runs a README shell block as one bash script against p,
// with the documented addresses swapped for p's, and returns its output.
func runREADMEBlock(t *testing.T, p *proc, block string) string {
	t.Helper()
	for _, tool := range []string{"kcat", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is missing (make deps installs it)", tool)
			}
			t.Skipf("%s not installed; make deps installs it", tool)
		}
	}
	script := strings.NewReplacer("127.0.0.1:9092", p.listen, "127.0.0.1:9644", strings.TrimPrefix(p.admin, "http://"),
		"bin/rtproxy", rtproxyBinary(t)).Replace(block)
	out, err := exec.Command("bash", "-e", "-o", "pipefail", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("README block failed: %v\n--- script\n%s\n--- output\n%s", err, script, out)
	}
	return string(out)
}

// TestREADMEQuickstartRuns runs the README's quickstart commands (the block
// after "In another terminal") against the built binary in embedded mode.
func TestREADMEQuickstartRuns(t *testing.T) {
	block := readmeBlock(t, "In another terminal:")
	p := startRun(t, filepath.Join(t.TempDir(), "rules"))
	got := runREADMEBlock(t, p, block)
	for _, want := range []string{`{"hello":"world"}`, "3 brokers:", "produced 100 records to payments",
		`rtproxy_proxy_requests_total{api="Produce"}`, "ready"} {
		if !strings.Contains(got, want) {
			t.Errorf("README commands' output lacks %q:\n%s", want, got)
		}
	}
	// kcat -c 3 prints three sample payments, from whichever partitions
	// answer first.
	if n := len(regexp.MustCompile(`(?m)^\{"txn_id":"txn-\d{8}","user_id":"u\d+","merchant_id":"m\d","amount":[0-9.]+,"status":"[a-z]+","ts":\d{13}\}$`).FindAllString(got, -1)); n != 3 {
		t.Errorf("want 3 sample payments consumed, found %d:\n%s", n, got)
	}
	// Every broker kcat -L lists is one of the proxy's listeners.
	for _, m := range regexp.MustCompile(`broker (\d+) at ([^ \n]+)`).FindAllStringSubmatch(got, -1) {
		host, port, _ := strings.Cut(m[2], ":")
		n, _ := strconv.Atoi(port)
		if host != "127.0.0.1" || n < p.brokerFirst || n >= p.brokerFirst+100 {
			t.Errorf("kcat -L shows broker %s at %s, not a proxy listener", m[1], m[2])
		}
	}
	p.stop(t)
}

// TestREADMEProcessingRuns runs the README's "Processing a stream" block
// against the binary with the quickstart's rule files.
func TestREADMEProcessingRuns(t *testing.T) {
	block := readmeBlock(t, "## Processing a stream")
	rulesDir, err := filepath.Abs(filepath.Join("..", "..", "examples", "quickstart", "rules"))
	if err != nil {
		t.Fatal(err)
	}
	p := startRun(t, rulesDir)
	got := runREADMEBlock(t, p, block)
	updates := regexp.MustCompile(`(?m)^\{.*"key":"/home".*\}$`).FindAllString(got, -1)
	if len(updates) != 3 || !strings.Contains(updates[2], `"views":3`) || !strings.Contains(updates[2], `"visitors":2`) {
		t.Errorf("want 3 updates for /home ending in views 3, visitors 2; got %q\n%s", updates, got)
	}
	if strings.Contains(got, `"key":"/cart"`) {
		t.Errorf("the bot's click was counted:\n%s", got)
	}
	// The Avro payments came through the embedded schema registry.
	if n := len(regexp.MustCompile(`(?m)^\{"amount":[0-9.]+,"txn_id":"txn-\d{8}","user_id":"u\d+"\}$`).FindAllString(got, -1)); n != 3 {
		t.Errorf("want 3 Avro payments through payments-avro, found %d:\n%s", n, got)
	}
	if !strings.Contains(got, `"name": "clicks-per-minute"`) {
		t.Errorf("/routes does not list clicks-per-minute:\n%s", got)
	}
	p.stop(t)
}
