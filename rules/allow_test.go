package rules

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

func TestAllowEnv(t *testing.T) {
	var none *Allow
	if err := none.Env("HOME"); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("nil allow-list allowed HOME: %v", err)
	}
	a := &Allow{EnvNames: []string{"SR_TOKEN", "REG_*"}}
	for name, ok := range map[string]bool{"SR_TOKEN": true, "REG_A": true, "REG_": true, "SR_TOKEN2": false, "SECRET_TOKEN": false, "XREG_A": false} {
		if err := a.Env(name); (err == nil) != ok {
			t.Errorf("Env(%s) = %v, want allowed=%v", name, err, ok)
		}
	}
}

func TestAllowFile(t *testing.T) {
	root := t.TempDir()
	rulesDir := filepath.Join(root, "rules")
	secrets := filepath.Join(root, "secrets")
	other := filepath.Join(root, "other")
	for _, d := range []string{rulesDir, secrets, other, filepath.Join(secrets, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string) string {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inRules := write(filepath.Join(rulesDir, "token"))
	inSecrets := write(filepath.Join(secrets, "sub", "token"))
	outside := write(filepath.Join(other, "token"))
	globbed := write(filepath.Join(other, "a.token"))
	link := filepath.Join(rulesDir, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	var none *Allow
	if err := none.File(inRules); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("nil allow-list (no rules dir) allowed a file: %v", err)
	}
	def := none.In(rulesDir)
	if err := def.File(inRules); err != nil {
		t.Errorf("default refuses a file inside the rules dir: %v", err)
	}
	if err := def.File(filepath.Join(rulesDir, "..", "other", "token")); !errors.Is(err, ErrNotAllowed) {
		t.Errorf("default allows ../other/token: %v", err)
	}
	if err := def.File(link); !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), "a link to "+outside) {
		t.Errorf("default allows a symlink out of the rules dir: %v", err)
	}
	if err := def.File("/etc/passwd"); !errors.Is(err, ErrNotAllowed) {
		t.Errorf("default allows /etc/passwd: %v", err)
	}
	a := (&Allow{Files: []string{secrets, filepath.Join(other, "*.token"), "relative/dir"}}).In(rulesDir)
	for p, ok := range map[string]bool{inRules: true, inSecrets: true, globbed: true, outside: false, link: false, "/etc/passwd": false} {
		if err := a.File(p); (err == nil) != ok {
			t.Errorf("File(%s) = %v, want allowed=%v", p, err, ok)
		}
	}
	if err := a.File(filepath.Join(secrets, "missing")); err != nil {
		t.Errorf("a file not there yet inside an allowed dir: %v", err)
	}
	// A FIFO inside the rules directory would hang the reader.
	fifo := filepath.Join(rulesDir, "fifo")
	if err := mkfifo(fifo); err == nil {
		if err := def.File(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("FIFO allowed: %v", err)
		}
	}
}

func TestAllowURL(t *testing.T) {
	var none *Allow
	if err := none.URL("http://registry:8081"); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("nil allow-list allowed a URL: %v", err)
	}
	a := &Allow{URLs: []string{"http://registry:8081", "https://api.example.com/v1/", "http://plain"}}
	for u, ok := range map[string]bool{
		"http://registry:8081":                   true,
		"http://REGISTRY:8081/subjects":          true,
		"https://registry:8081":                  false, // scheme differs
		"http://registry:8082":                   false,
		"http://registry.evil:8081":              false,
		"http://registry:8081.evil":              false,
		"https://api.example.com/v1":             true,
		"https://api.example.com/v1/schemas":     true,
		"https://api.example.com/v10":            false,
		"https://api.example.com/v1/../admin":    false,
		"https://api.example.com/v1/%2e%2e/root": false,
		"http://plain:80/x":                      true, // the default port is the port
		"http://plain:8080":                      false,
		"ftp://registry:8081":                    false,
	} {
		if err := a.URL(u); (err == nil) != ok {
			t.Errorf("URL(%s) = %v, want allowed=%v", u, err, ok)
		}
	}
}

// TestRuleFileRegistryAllowList is finding 10 at the loader: a rule file's
// schema_registry may name only allowed variables, files and URLs.
func TestRuleFileRegistryAllowList(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(outside, []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "route: a\nsource: { topic: in, format: avro }\nsink: { topic: out }\n"
	allow := &Allow{URLs: []string{"http://registry:8081"}, EnvNames: []string{"SR_TOKEN"}}
	for name, c := range map[string]struct {
		body  string
		allow *Allow
		want  string // "" = accepted
	}{
		"env refused by default":   {base + "schema_registry: { url: http://registry:8081, bearer_token_env: SECRET_TOKEN }\n", &Allow{URLs: allow.URLs}, "4:65: schema_registry.bearer_token_env: the environment variable SECRET_TOKEN is not allowed by the proxy's rules.allow"},
		"env not listed":           {base + "schema_registry: { url: http://registry:8081, basic_auth_env: HOME }\n", allow, "schema_registry.basic_auth_env: the environment variable HOME is not allowed"},
		"env listed":               {base + "schema_registry: { url: http://registry:8081, bearer_token_env: SR_TOKEN }\n", allow, ""},
		"url not listed":           {base + "schema_registry: { url: \"http://127.0.0.1:1\" }\n", allow, "4:25: schema_registry.url: the URL http://127.0.0.1:1 is not allowed by the proxy's rules.allow"},
		"one of several urls":      {base + "schema_registry: { url: \"http://registry:8081,http://evil:8081\" }\n", allow, "the URL http://evil:8081 is not allowed"},
		"url with nil allow":       {base + "schema_registry: { url: \"http://registry:8081\" }\n", nil, "is not allowed by the proxy's rules.allow"},
		"token file outside":       {base + "schema_registry: { url: http://registry:8081, bearer_token_file: " + outside + " }\n", allow, "schema_registry.bearer_token_file: the file " + outside + " is outside the rules directory"},
		"token file relative out":  {base + "schema_registry: { url: http://registry:8081, bearer_token_file: ../../../../../../etc/shadow }\n", allow, "schema_registry.bearer_token_file: the file /etc/shadow is outside the rules directory"},
		"ca file outside":          {base + "schema_registry: { url: http://registry:8081, ca_file: /etc/ssl/certs/ca-certificates.crt }\n", allow, "schema_registry.ca_file: the file /etc/ssl/certs/ca-certificates.crt"},
		"token file inside":        {base + "schema_registry: { url: http://registry:8081, bearer_token_file: secrets/token }\n", allow, ""},
		"token file allowed there": {base + "schema_registry: { url: http://registry:8081, bearer_token_file: " + outside + " }\n", &Allow{URLs: allow.URLs, Files: []string{filepath.Dir(outside)}}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			writeFiles(t, dir, map[string]string{"r.yaml": c.body})
			_, err := LoadFileWith(filepath.Join(dir, "r.yaml"), Options{Allow: c.allow})
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want %q", err, c.want)
			}
			if err != nil && strings.Contains(err.Error(), "s3cr3t") {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
}

// FuzzAllowURL: the URL check never panics, and what it allows has the
// prefix's scheme and host and a cleaned path at or below the prefix's.
func FuzzAllowURL(f *testing.F) {
	f.Add("https://api.example.com/v1", "https://api.example.com/v1/../admin")
	f.Add("http://r:8081", "http://R:8081/subjects/x")
	f.Add("http://r", "http://r:80/%2e%2e/x")
	f.Add("http://[::1]:1", "http://[::1]:1/a")
	f.Fuzz(func(t *testing.T, entry, cand string) {
		a := &Allow{URLs: []string{entry}}
		if a.URL(cand) != nil {
			return
		}
		e, err1 := parseAllowURL(entry)
		c, err2 := parseAllowURL(cand)
		if err1 != nil || err2 != nil {
			t.Fatalf("allowed %q under %q, but one does not parse: %v %v", cand, entry, err1, err2)
		}
		if e.Scheme != c.Scheme || e.Host != c.Host {
			t.Fatalf("allowed %q under %q: another origin", cand, entry)
		}
		ep := strings.TrimSuffix(path.Clean("/"+e.Path), "/")
		if cp := path.Clean("/" + c.Path); ep != "" && cp != ep && !strings.HasPrefix(cp, ep+"/") {
			t.Fatalf("allowed %q under %q: path %q is not below %q", cand, entry, cp, ep)
		}
	})
}

// FuzzGuessGuard: reading a broken file's lines never panics, and a topic
// it returns is one a guard may name.
func FuzzGuessGuard(f *testing.F) {
	f.Add("guard: g\ntopic: payments\nchecks: [valid_json\n")
	f.Add("guard: g\ntopic: \"pay.*\" # comment\n")
	f.Add("topic: x\n")
	f.Fuzz(func(t *testing.T, src string) {
		guard, topic := guessGuard(strings.Split(src, "\n"))
		if topic != "" && (!guard || !(topicNameRe.MatchString(topic) || validGlob(topic))) {
			t.Fatalf("guessGuard(%q) = %v, %q", src, guard, topic)
		}
	})
}
