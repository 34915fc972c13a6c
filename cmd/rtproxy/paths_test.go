package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// pathsLayout writes a project directory as the docs lay it out: rules/
// with an Avro route whose sink.schema sits beside it, a route joining a
// table file of tables/ (outside the rules directory, allowed by
// --tables-dir), and a test file for the Avro route. It returns the
// project directory.
func pathsLayout(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"rules/orders-avro-out.yaml": "route: orders-avro-out\nsource: { topic: orders }\nsink: { topic: orders.avro, format: avro, schema: orders-out.avsc }\n" +
			"steps:\n  - map: { id: value.id, amount: value.amount }\n",
		"rules/orders-out.avsc": `{"type": "record", "name": "Out", "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}` + "\n",
		"rules/orders-avro-out.test.yaml": "tests:\n  - name: one record\n    input:\n      - { key: a, value: { id: 1, amount: 2.5 } }\n" +
			"    expect:\n      sink:\n        - { key: a }\n",
		"rules/enrich.yaml": "route: orders-enrich\nsource: { topic: orders }\nsink: { topic: orders.enriched }\n" +
			"tables:\n  countries: { file: ../tables/countries.csv, key: code }\n" +
			"steps:\n  - join: { table: countries, on: value.country, as: country, missing: keep }\n  - set:\n      country_name: country?.name\n",
		"rules/enrich.test.yaml": "tests:\n  - name: joined\n    input:\n      - { key: a, value: { country: FR } }\n" +
			"    expect:\n      sink:\n        - { key: a, value: { country: FR, country_name: France } }\n",
		"tables/countries.csv": "code,name\nFR,France\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runIn runs the binary in dir to completion.
func runIn(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(rtproxyBinary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = testkit.ChildAttr()
	if err := cmd.Run(); err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("run %v: %v", args, err)
		}
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestBinaryPathsRelativeAndAbsolute: `rtproxy check`, `rtproxy test` and
// `rtproxy run` resolve the rules directory and tables_dir the same way,
// given relative (from the project directory, as the docs write them) or
// absolute: a schema file beside its route and a table file under
// --tables-dir are inside, for all three commands and both forms.
func TestBinaryPathsRelativeAndAbsolute(t *testing.T) {
	dir := pathsLayout(t)
	forms := map[string][2]string{
		"relative": {"rules/", "."},
		"absolute": {filepath.Join(dir, "rules"), dir},
	}
	for form, p := range forms {
		rulesDir, tablesDir := p[0], p[1]
		t.Run("check/"+form, func(t *testing.T) {
			code, out := runIn(t, dir, "check", "--tables-dir", tablesDir, rulesDir)
			if code != 0 || strings.Count(out, "ok ") != 2 || strings.Contains(out, "outside") {
				t.Fatalf("rtproxy check --tables-dir %s %s: exit %d\n%s", tablesDir, rulesDir, code, out)
			}
			// A file named alone, relative to the project directory.
			code, out = runIn(t, dir, "check", filepath.Join(rulesDir, "orders-avro-out.yaml"))
			if code != 0 || !strings.Contains(out, "ok ") {
				t.Fatalf("rtproxy check FILE: exit %d\n%s", code, out)
			}
		})
		t.Run("test/"+form, func(t *testing.T) {
			code, out := runIn(t, dir, "test", "-v", "--tables-dir", tablesDir, rulesDir)
			if code != 0 || !strings.Contains(out, "--- PASS: orders-avro-out/one record") || !strings.Contains(out, "--- PASS: orders-enrich/joined") {
				t.Fatalf("rtproxy test --tables-dir %s %s: exit %d\n%s", tablesDir, rulesDir, code, out)
			}
		})
		t.Run("run/"+form, func(t *testing.T) {
			p := testkit.StartProxy(t, testkit.ProxyOpts{
				RulesDir: rulesDir,
				StateDir: filepath.Join(t.TempDir(), "state"),
				Env:      []string{"RTPROXY_TABLES_DIR=" + tablesDir},
				CleanEnv: true,
				Dir:      dir,
				Binary:   rtproxyBinary(t),
			})
			deadline := time.Now().Add(20 * time.Second)
			for {
				_, body, err := httpGet(p.AdminURL + "/routes")
				var rs []struct {
					Name      string `json:"name"`
					RuleError string `json:"rule_error"`
				}
				if err == nil {
					err = json.Unmarshal([]byte(body), &rs)
				}
				names := map[string]string{}
				for _, r := range rs {
					names[r.Name] = r.RuleError
				}
				if err == nil && len(rs) == 2 && names["orders-avro-out"] == "" && names["orders-enrich"] == "" {
					if _, ok := names["orders-avro-out"]; ok {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("rtproxy run --rules-dir %s --tables-dir %s: /routes %v %s\nlogs:\n%s", rulesDir, tablesDir, err, body, p.Logs())
				}
				time.Sleep(100 * time.Millisecond)
			}
			if strings.Contains(p.Logs(), "outside") {
				t.Fatalf("run logged a refusal:\n%s", p.Logs())
			}
		})
	}
}

// TestBinaryRuleFileSymlinkOutside (issue 25, finding 11): rule files that
// are links out of the rules directory (/proc/self/environ, a file of
// secret lines as /etc/shadow) are refused unread by `rtproxy run` and
// `rtproxy check`: their content is on no page (/route/NAME, /routes, the
// home page), in no log line and in no check output, while a good route
// beside them runs.
func TestBinaryRuleFileSymlinkOutside(t *testing.T) {
	rulesDir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(outside, []byte("root:$6$SECRET-HASH-not-shown:19000:0:99999:7:::\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rulesDir, "good.yaml"), []byte("route: good\nsource: { topic: a }\nsink: { topic: b }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"environ.yaml": "/proc/self/environ", "shadow.yaml": outside} {
		if err := os.Symlink(target, filepath.Join(rulesDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	secrets := []string{"SECRET-HASH", "RTPROXY_LOG_LEVEL", "hunter2-secret"}
	noSecret := func(what, s string) {
		t.Helper()
		for _, sec := range secrets {
			if strings.Contains(s, sec) {
				t.Errorf("%s shows %q, from a file outside the rules directory:\n%s", what, sec, s)
			}
		}
	}

	code, out := runIn(t, t.TempDir(), "check", rulesDir)
	if code != 1 || strings.Count(out, "rule file refused") != 2 {
		t.Errorf("check: exit %d\n%s", code, out)
	}
	noSecret("rtproxy check", out)

	p := startRun(t, rulesDir, "RTPROXY_LOG_LEVEL=debug", "RTPROXY_SECRET_TOKEN=hunter2-secret")
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, body, _ := httpGet(p.admin + "/routes")
		if strings.Contains(body, `"good"`) && strings.Count(body, "rule file refused") == 2 {
			noSecret("/routes", body)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/routes never showed good and two refusals: %s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, page := range []string{"/", "/route/environ.yaml", "/route/shadow.yaml", "/route/good"} {
		code, body, err := httpGet(p.admin + page)
		if err != nil || code != 200 {
			t.Fatalf("GET %s: %d %v", page, code, err)
		}
		noSecret("GET "+page, body)
		if page == "/route/environ.yaml" && !strings.Contains(body, "outside the directory") {
			t.Errorf("GET %s does not say why the file is not shown:\n%s", page, body)
		}
	}
	noSecret("the logs", p.Logs())
	p.stop(t)
}
