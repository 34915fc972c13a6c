package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// TestBinaryRuleFileSecretsAllowList is finding 10 through the binary: a
// rule file names a secret (an environment variable, a file outside the
// rules directory) and a URL of its choosing; with no rules.allow in the
// proxy's config the proxy must refuse both files and never send either
// secret anywhere. A third file names what the config allows and runs.
func TestBinaryRuleFileSecretsAllowList(t *testing.T) {
	var mu sync.Mutex
	var auths []string
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, `{"error_code":40403,"message":"Schema not found"}`, http.StatusNotFound)
	}))
	defer reg.Close()
	secretFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(secretFile, []byte("s3cr3t-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	allowedDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(allowedDir, "token"), []byte("allowed-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rulesDir := t.TempDir()
	files := map[string]string{
		"env.yaml":     "route: leak-env\nsource: { topic: sec.env }\nsink: { topic: sec.env.out }\nschema_registry: { url: \"" + reg.URL + "\", bearer_token_env: SECRET_TOKEN }\n",
		"file.yaml":    "route: leak-file\nsource: { topic: sec.file, format: avro }\nsink: { topic: sec.file.out }\nschema_registry: { url: \"" + reg.URL + "\", bearer_token_file: " + secretFile + " }\n",
		"allowed.yaml": "route: allowed\nsource: { topic: sec.ok, format: avro }\nsink: { topic: sec.ok.out }\nschema_registry: { url: \"" + reg.URL + "/\", bearer_token_file: " + filepath.Join(allowedDir, "token") + " }\n",
	}
	// env.yaml reads Avro too: the route decodes through the registry.
	files["env.yaml"] = strings.Replace(files["env.yaml"], "topic: sec.env }", "topic: sec.env, format: avro }", 1)
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(rulesDir, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfgFile := filepath.Join(t.TempDir(), "rtproxy.yaml")
	cfg := "rules:\n  allow:\n    files: [" + allowedDir + "]\n    urls: [\"" + reg.URL + "\"]\n"
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := testkit.StartProxy(t, testkit.ProxyOpts{
		RulesDir: rulesDir, StateDir: filepath.Join(t.TempDir(), "state"), CleanEnv: true, Binary: rtproxyBinary(t),
		ExtraArgs: []string{"--config", cfgFile},
		Env:       []string{"SECRET_TOKEN=s3cr3t-env"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.Addr), kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, topic := range []string{"sec.env", "sec.file", "sec.ok"} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("\x00\x00\x00\x00\x01xyz")}).FirstErr(); err != nil {
			t.Fatalf("produce to %s: %v", topic, err)
		}
	}
	// The allowed route asks the registry for schema 1 with its token;
	// by then the refused ones would have asked too.
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		got := strings.Join(auths, "|")
		mu.Unlock()
		if strings.Contains(got, "s3cr3t") {
			t.Fatalf("the proxy sent a secret a rule file named to a URL of its choosing: %q", got)
		}
		if strings.Contains(got, "Bearer allowed-token") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the allowed route never reached the registry (requests: %q)", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	if got := strings.Join(auths, "|"); strings.Contains(got, "s3cr3t") {
		t.Fatalf("secret sent: %q", got)
	}
	mu.Unlock()
	var status []struct{ Name, File, State, LastError string }
	p.GetJSON(t, "/routes", &status)
	refused := map[string]string{}
	for _, s := range status {
		refused[filepath.Base(s.File)] = s.LastError
	}
	_, body, _ := httpGet(p.AdminURL + "/routes")
	for file, want := range map[string]string{
		"env.yaml":  "schema_registry.bearer_token_env: the environment variable SECRET_TOKEN is not allowed by the proxy's rules.allow",
		"file.yaml": "schema_registry.bearer_token_file: the file " + secretFile + " is outside the rules directory and not allowed",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/routes does not say %s is refused (%q):\n%s", file, want, body)
		}
	}
	if strings.Contains(body, "s3cr3t") || strings.Contains(p.Logs(), "s3cr3t") {
		t.Error("a secret is shown on /routes or in the logs")
	}
}

// TestBinaryCheckAllowList is finding 10 at `rtproxy check`: the rule file
// that names a variable and a registry is refused with the defaults and
// accepted with a config whose rules.allow and schema_registry.url allow
// them (--config, or RTPROXY_CONFIG).
func TestBinaryCheckAllowList(t *testing.T) {
	dir := t.TempDir()
	rule := filepath.Join(dir, "r.yaml")
	os.WriteFile(rule, []byte("route: r\nsource: { topic: in, format: avro }\nsink: { topic: out }\nschema_registry: { url: \"http://registry:8081\", bearer_token_env: SR_TOKEN }\n"), 0o644)
	code, out, _ := runBinary(t, nil, "check", dir)
	for _, want := range []string{
		rule + ":4:25: schema_registry.url: the URL http://registry:8081 is not allowed by the proxy's rules.allow",
		rule + ":4:67: schema_registry.bearer_token_env: the environment variable SR_TOKEN is not allowed",
	} {
		if code != 1 || !strings.Contains(out, want) {
			t.Errorf("check with the defaults: exit %d, want %q in:\n%s", code, want, out)
		}
	}
	cfg := filepath.Join(t.TempDir(), "rtproxy.yaml")
	os.WriteFile(cfg, []byte("upstream: [kafka:9092]\nschema_registry: { url: \"http://registry:8081\" }\nrules:\n  allow:\n    env: [SR_*]\n"), 0o644)
	if code, out, errOut := runBinary(t, nil, "check", "--config", cfg, dir); code != 0 {
		t.Errorf("check --config: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runBinary(t, []string{"RTPROXY_CONFIG=" + cfg}, "check", dir); code != 0 {
		t.Errorf("check with RTPROXY_CONFIG: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runBinary(t, nil, "check", "--config", filepath.Join(dir, "missing.yaml"), dir); code != 2 || !strings.Contains(errOut, "rtproxy check: config:") {
		t.Errorf("check with a missing config: exit %d %q", code, errOut)
	}
}
