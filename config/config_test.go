package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default() does not validate: %v", err)
	}
	if !c.Embedded() || c.Listen != "127.0.0.1:9092" || c.BrokerPorts != 9093 || c.BrokerPortCount != 100 ||
		c.AdminListen != "127.0.0.1:9644" || c.MaxFrameBytes != 104857600 || c.ShutdownGrace != 10*time.Second ||
		c.RulesDir != "./rules" || c.StateDir != "./state" || c.LogLevel != "info" || c.LogFormat != "text" ||
		c.Admin.ShowRecords || c.Admin.RedactHeaders != DefaultRedactHeaders {
		t.Fatalf("defaults differ from the agreed ones: %+v", c)
	}
}

func TestParseFullFile(t *testing.T) {
	c := Default()
	if err := c.LoadFile("testdata/full.yaml"); err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Listen: "0.0.0.0:19092", AdvertiseHost: "proxy.example.internal", BrokerPorts: 20000, BrokerPortCount: 50,
		Upstream: []string{"kafka-0.example:9092", "kafka-1.example:9092"}, RulesDir: "/etc/rtproxy/rules",
		StateDir: "/var/lib/rtproxy", AdminListen: "0.0.0.0:19644", LogLevel: "debug", LogFormat: "json",
		MaxFrameBytes: 2097152, ShutdownGrace: 30 * time.Second,
		GroupProtocol: "auto", GroupSessionTimeout: 10 * time.Second, BatchWindow: 20 * time.Millisecond,
		Admin: Admin{ShowRecords: true, RedactHeaders: "authorization|x-tenant-key"},
		Proxy: ProxyLimits{MaxConnections: 10000, MaxHeldBytes: 256 << 20, MaxDecodedBytes: 32 << 20, MaxRecordsPerRequest: 200_000, MaxDecodedBytesTotal: 128 << 20, ClientIdleTimeout: 10 * time.Minute, RequestReadTimeout: 60 * time.Second},
		TLS: TLS{
			Client:   ClientTLS{CertFile: "/tls/server.crt", KeyFile: "/tls/server.key", ClientCAFile: "/tls/clients-ca.crt", RequireClientCert: true},
			Upstream: UpstreamTLS{Enabled: true, CAFile: "/tls/kafka-ca.crt", CertFile: "/tls/proxy.crt", KeyFile: "/tls/proxy.key", ServerName: "kafka.example"},
		},
		SASL: SASL{Mechanism: "SCRAM-SHA-512", Username: "rtproxy", Password: "s3cret"},
		SchemaRegistry: SchemaRegistry{URL: "https://registry.example:8081", BearerTokenFile: "/secrets/registry-token",
			CAFile: "/tls/registry-ca.crt", Timeout: 5 * time.Second,
			MaxResponseBytes: 8 << 20, MaxSchemaBytes: 1 << 20, MaxSchemaDepth: 64, MaxReferences: 64},
		Limits: Default().Limits,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("full.yaml should validate: %v", err)
	}
	// YAML() must read back to the same value.
	back := Default()
	if err := back.Parse("roundtrip", c.YAML()); err != nil {
		t.Fatalf("re-parse YAML(): %v\n%s", err, c.YAML())
	}
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip changed the config:\n%+v\n%+v", back, c)
	}
	if r := c.Redacted(); r.SASL.Password != "REDACTED" || c.SASL.Password != "s3cret" {
		t.Fatalf("Redacted: got %q, original now %q", r.SASL.Password, c.SASL.Password)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, doc, want string
	}{
		{"unknown top key", "listen: 127.0.0.1:1\nlisten_addr: x\n", `f.yaml:2:1: unknown key "listen_addr"`},
		{"unknown nested key", "tls:\n  upstream:\n    enable: true\n", `f.yaml:3:5: unknown key "tls.upstream.enable"`},
		{"bad int", "broker_ports: lots\n", `f.yaml:1:15: broker_ports: "lots" is not an integer`},
		{"bad duration", "shutdown_grace: 10\n", `f.yaml:1:17: shutdown_grace: "10" is not a duration`},
		{"bad bool", "tls:\n  upstream:\n    enabled: maybe\n", `f.yaml:3:14: tls.upstream.enabled: "maybe" is not a boolean`},
		{"list of maps", "upstream:\n  - {host: a}\n", `f.yaml:2:5: upstream: each entry must be a string, got a mapping`},
		{"mapping for scalar", "listen:\n  host: a\n", `f.yaml:2:3: listen must be a string, got a mapping`},
		{"scalar for section", "tls: yes\n", `f.yaml:1:6: tls must be a mapping of keys, got a scalar`},
		{"top-level list", "- a\n- b\n", `f.yaml:1:1: the config must be a mapping of keys, got a list`},
		{"duplicate key", "listen: a:1\nlisten: b:2\n", `f.yaml:2:1: key "listen" appears twice (first on line 1)`},
		{"two documents", "listen: a:1\n---\nlisten: b:2\n", `f.yaml:2:1: a config file holds one YAML document`},
		{"syntax", "listen: [\n", `f.yaml: yaml:`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			err := c.Parse("f.yaml", []byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParseKeepsUnsetAndNull(t *testing.T) {
	c := Default()
	if err := c.Parse("f", []byte("rules_dir: /r\nlisten: ~\nupstream: a:1, b:2\n")); err != nil {
		t.Fatal(err)
	}
	if c.RulesDir != "/r" || c.Listen != "127.0.0.1:9092" || c.StateDir != "./state" {
		t.Fatalf("got %+v", c)
	}
	if !reflect.DeepEqual(c.Upstream, []string{"a:1", "b:2"}) {
		t.Fatalf("comma string upstream: %q", c.Upstream)
	}
	if err := c.Parse("empty", nil); err != nil {
		t.Fatalf("empty file: %v", err)
	}
}

func TestEnvNames(t *testing.T) {
	want := map[string]string{
		"listen": "RTPROXY_LISTEN", "upstream": "RTPROXY_UPSTREAM", "rules_dir": "RTPROXY_RULES_DIR",
		"broker_ports": "RTPROXY_BROKER_PORTS", "tls.upstream.ca_file": "RTPROXY_TLS_UPSTREAM_CA_FILE",
		"sasl.password": "RTPROXY_SASL_PASSWORD", "proxy.max_connections": "RTPROXY_PROXY_MAX_CONNECTIONS", "state_retention": "RTPROXY_STATE_RETENTION", "tls.client.require_client_cert": "RTPROXY_TLS_CLIENT_REQUIRE_CLIENT_CERT",
		"batch_window": "RTPROXY_BATCH_WINDOW", "pprof": "RTPROXY_PPROF", "admin.show_records": "RTPROXY_ADMIN_SHOW_RECORDS", "admin.redact_headers": "RTPROXY_ADMIN_REDACT_HEADERS",
		"schema_registry.url":               "RTPROXY_SCHEMA_REGISTRY_URL",
		"schema_registry.bearer_token_file": "RTPROXY_SCHEMA_REGISTRY_BEARER_TOKEN_FILE",
		"rules.allow.env":                   "RTPROXY_RULES_ALLOW_ENV",
		"rules.allow.files":                 "RTPROXY_RULES_ALLOW_FILES",
		"rules.allow.urls":                  "RTPROXY_RULES_ALLOW_URLS",
	}
	got := map[string]string{}
	for _, k := range Keys() {
		got[k.Path] = k.Env
	}
	for p, e := range want {
		if got[p] != e {
			t.Errorf("%s: env %q, want %q", p, got[p], e)
		}
	}
	if len(got) != 62 {
		t.Errorf("%d keys, want 62 (a field was added or lost its yaml tag?)", len(got))
	}
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rtproxy.yaml")
	if err := os.WriteFile(file, []byte("listen: 127.0.0.1:1001\nrules_dir: /file/rules\nstate_dir: /file/state\nupstream: [file:9092]\nlog_level: warn\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		file     string
		env      map[string]string
		flags    map[string]string
		listen   string
		rulesDir string
		stateDir string
		upstream []string
		logLevel string
		embedded bool
	}{
		{"defaults only", "", nil, nil, "127.0.0.1:9092", "./rules", "./state", nil, "info", true},
		{"file over defaults", file, nil, nil, "127.0.0.1:1001", "/file/rules", "/file/state", []string{"file:9092"}, "warn", false},
		{"env over file", file, map[string]string{"RTPROXY_LISTEN": "127.0.0.1:2002", "RTPROXY_UPSTREAM": "e1:1,e2:2"}, nil,
			"127.0.0.1:2002", "/file/rules", "/file/state", []string{"e1:1", "e2:2"}, "warn", false},
		{"flag over env over file", file, map[string]string{"RTPROXY_LISTEN": "127.0.0.1:2002", "RTPROXY_RULES_DIR": "/env/rules"},
			map[string]string{"listen": "127.0.0.1:3003", "log_level": "debug"},
			"127.0.0.1:3003", "/env/rules", "/file/state", []string{"file:9092"}, "debug", false},
		{"empty env clears file upstream", file, map[string]string{"RTPROXY_UPSTREAM": ""}, nil,
			"127.0.0.1:1001", "/file/rules", "/file/state", nil, "warn", true},
		{"flag upstream over env", "", map[string]string{"RTPROXY_UPSTREAM": "e:1"}, map[string]string{"upstream": "f1:1, f2:2"},
			"127.0.0.1:9092", "./rules", "./state", []string{"f1:1", "f2:2"}, "info", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Resolve(tc.file, env(tc.env), tc.flags)
			if err != nil {
				t.Fatal(err)
			}
			if c.Listen != tc.listen || c.RulesDir != tc.rulesDir || c.StateDir != tc.stateDir || c.LogLevel != tc.logLevel ||
				!reflect.DeepEqual(c.Upstream, tc.upstream) || c.Embedded() != tc.embedded {
				t.Fatalf("got listen=%s rules=%s state=%s upstream=%q level=%s embedded=%v",
					c.Listen, c.RulesDir, c.StateDir, c.Upstream, c.LogLevel, c.Embedded())
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	cases := []struct {
		name  string
		env   map[string]string
		flags map[string]string
		want  string
	}{
		{"bad env int", map[string]string{"RTPROXY_BROKER_PORTS": "x"}, nil, `RTPROXY_BROKER_PORTS: "x" is not an integer`},
		{"bad env duration", map[string]string{"RTPROXY_SHUTDOWN_GRACE": "soon"}, nil, `RTPROXY_SHUTDOWN_GRACE: "soon" is not a duration`},
		{"bad flag int", nil, map[string]string{"broker_ports": "-"}, `flag for broker_ports: "-" is not an integer`},
		{"unknown flag key", nil, map[string]string{"nope": "1"}, `unknown setting "nope"`},
		{"validation runs last", nil, map[string]string{"log_level": "loud"}, `log_level: "loud" is not one of`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve("", env(tc.env), tc.flags)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := Resolve("/does/not/exist.yaml", nil, nil); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(c *Config)
		want string // "" = valid
	}{
		{"default", func(c *Config) {}, ""},
		{"schema registry ok", func(c *Config) {
			c.SchemaRegistry = SchemaRegistry{URL: "http://r:8081", BasicAuthEnv: "SR_AUTH", Timeout: time.Second}
		}, ""},
		{"schema registry url scheme", func(c *Config) { c.SchemaRegistry.URL = "r:8081" }, `schema_registry.url: "r:8081" must start with http:// or https://`},
		{"schema registry inline credentials", func(c *Config) { c.SchemaRegistry.URL = "http://u:p@r:8081" }, "schema_registry.url: holds credentials"},
		{"schema registry two auths", func(c *Config) {
			c.SchemaRegistry = SchemaRegistry{URL: "http://r", BasicAuthFile: "a", BearerTokenEnv: "T", Timeout: time.Second}
		}, "schema_registry: basic auth and a bearer token are both set; use one"},
		{"schema registry negative bound", func(c *Config) { c.SchemaRegistry.MaxResponseBytes = -1 }, "schema_registry.max_response_bytes: must be positive"},
		{"schema registry depth", func(c *Config) { c.SchemaRegistry.MaxSchemaDepth = 20000 }, "schema_registry.max_schema_depth: must be between 1 and 10000"},
		{"schema registry auth without url", func(c *Config) { c.SchemaRegistry.BearerTokenFile = "t" }, "schema_registry.url: required"},
		{"listen not host:port", func(c *Config) { c.Listen = "9092" }, `listen: "9092" is not host:port`},
		{"listen any interface", func(c *Config) { c.Listen = ":9092" }, ""},
		{"admin empty", func(c *Config) { c.AdminListen = "" }, "admin_listen: must not be empty"},
		{"listen inside broker range", func(c *Config) { c.Listen = "127.0.0.1:9100" }, "listen: port 9100 is inside the broker port range 9093-9192"},
		{"admin inside broker range", func(c *Config) { c.AdminListen = "127.0.0.1:9093" }, "admin_listen: port 9093 is inside the broker port range"},
		{"admin equals listen", func(c *Config) { c.AdminListen = "0.0.0.0:9092" }, "admin_listen: port 9092 is also the listen port"},
		{"broker range past 65535", func(c *Config) { c.BrokerPorts = 65500 }, "broker_port_count: range 65500-65599 runs past port 65535"},
		{"broker port zero", func(c *Config) { c.BrokerPorts = 0 }, "broker_ports: 0 is not a port"},
		{"broker count zero", func(c *Config) { c.BrokerPortCount = 0 }, "broker_port_count: must be at least 1"},
		{"advertise with port", func(c *Config) { c.AdvertiseHost = "host:9092" }, "advertise_host: \"host:9092\" is not a host name"},
		{"advertise ipv6", func(c *Config) { c.AdvertiseHost = "::1" }, ""},
		{"upstream bad", func(c *Config) { c.Upstream = []string{"k:9092", "nohost"} }, `upstream[1]: "nohost" is not host:port`},
		{"upstream port 0", func(c *Config) { c.Upstream = []string{"k:0"} }, "upstream[0]: \"k:0\": port 0"},
		{"rules dir empty", func(c *Config) { c.RulesDir = "" }, "rules_dir: must not be empty"},
		{"log format", func(c *Config) { c.LogFormat = "xml" }, `log_format: "xml" is not one of text, json`},
		{"frame too small", func(c *Config) { c.MaxFrameBytes = 10 }, "max_frame_bytes: 10 is outside"},
		{"frame too big", func(c *Config) { c.MaxFrameBytes = 1 << 31 }, "max_frame_bytes: 2147483648 is outside"},
		{"negative grace", func(c *Config) { c.ShutdownGrace = -time.Second }, "shutdown_grace: must be positive"},
		{"zero grace", func(c *Config) { c.ShutdownGrace = 0 }, "shutdown_grace: must be positive"},
		{"negative batch window", func(c *Config) { c.BatchWindow = -time.Millisecond }, "batch_window: must be between 0 (off) and 1s (e.g. 5ms), got -1ms"},
		{"batch window too long", func(c *Config) { c.BatchWindow = 2 * time.Second }, "batch_window: must be between 0 (off) and 1s (e.g. 5ms), got 2s"},
		{"batch window off", func(c *Config) { c.BatchWindow = 0 }, ""},
		{"negative retention", func(c *Config) { c.StateRetention = -time.Hour }, "state_retention: must be 0 (keep until `rtproxy state drop`) or positive (e.g. 24h), got -1h0m0s"},
		{"forward identity without a certificate", func(c *Config) {
			c.Upstream = []string{"k:9093"}
			c.TLS.Upstream.Enabled, c.TLS.Upstream.ForwardIdentity = true, true
		}, "tls.upstream.forward_identity: needs cert_file: there is no client certificate to forward"},
		{"forward identity to unauthenticated clients on a public listener", func(c *Config) {
			c.Upstream = []string{"k:9093"}
			c.Listen = "0.0.0.0:9092"
			c.TLS.Upstream = UpstreamTLS{Enabled: true, CertFile: "c.pem", KeyFile: "k.pem", ForwardIdentity: true}
		}, "tls.upstream.forward_identity: would hand the proxy's broker identity (its client certificate) to every client that can reach 0.0.0.0:9092; authenticate clients (tls.client.require_client_cert) or listen on loopback"},
		{"client cert without key", func(c *Config) { c.TLS.Client.CertFile = "a" }, "tls.client: cert_file and key_file must be set together"},
		{"client CA without cert", func(c *Config) { c.TLS.Client.ClientCAFile = "ca" }, "client TLS is off"},
		{"require client cert without CA", func(c *Config) {
			c.TLS.Client = ClientTLS{CertFile: "c", KeyFile: "k", RequireClientCert: true}
		}, "tls.client.require_client_cert: needs client_ca_file"},
		{"upstream TLS files while disabled", func(c *Config) {
			c.Upstream = []string{"k:1"}
			c.TLS.Upstream.CAFile = "ca"
		}, "tls.upstream: ca_file/cert_file/key_file/server_name/insecure_skip_verify are set but enabled is false"},
		{"upstream TLS with embedded", func(c *Config) { c.TLS.Upstream.Enabled = true }, "tls.upstream.enabled: the embedded development broker speaks plaintext"},
		{"upstream TLS ok", func(c *Config) {
			c.Upstream = []string{"k:1"}
			c.TLS.Upstream = UpstreamTLS{Enabled: true, CAFile: "ca", ServerName: "k"}
		}, ""},
		{"sasl unknown mech", func(c *Config) {
			c.Upstream = []string{"k:1"}
			c.SASL = SASL{Mechanism: "GSSAPI", Username: "u"}
		}, `sasl.mechanism: "GSSAPI" is not one of`},
		{"sasl no user", func(c *Config) {
			c.Upstream = []string{"k:1"}
			c.SASL = SASL{Mechanism: MechPlain}
		}, "sasl.username: required with mechanism PLAIN"},
		{"sasl creds without mech", func(c *Config) { c.SASL = SASL{Username: "u", Password: "p"} }, "sasl.mechanism: username/password are set but no mechanism"},
		{"sasl with embedded", func(c *Config) { c.SASL = SASL{Mechanism: MechScramSHA256, Username: "u"} }, "sasl.mechanism: the embedded development broker has no SASL"},
		{"redact_headers not a regexp", func(c *Config) { c.Admin.RedactHeaders = "token|(" }, `admin.redact_headers: "token|(" is not a regular expression: error parsing regexp: missing closing )`},
		{"redact_headers empty: every header", func(c *Config) { c.Admin.RedactHeaders = "" }, ""},
		{"two problems reported together", func(c *Config) { c.LogLevel = "x"; c.RulesDir = "" }, "rules_dir: must not be empty\nlog_level"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mod(c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestRelativePathsInFileFollowTheFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "conf", "rtproxy.yaml")
	os.MkdirAll(filepath.Dir(file), 0o755)
	os.WriteFile(file, []byte("rules_dir: rules\nstate_dir: /abs/state\nlisten: 127.0.0.1:1\n"+
		"upstream: [k:1]\ntls: {upstream: {enabled: true, ca_file: ../ca.pem}}\n"), 0o644)
	c, err := Resolve(file, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.RulesDir != filepath.Join(dir, "conf", "rules") || c.StateDir != "/abs/state" || c.TLS.Upstream.CAFile != filepath.Join(dir, "ca.pem") {
		t.Fatalf("rules_dir %s state_dir %s ca_file %s", c.RulesDir, c.StateDir, c.TLS.Upstream.CAFile)
	}
	// From a flag or the environment a relative path stays as given.
	c, err = Resolve(file, env(map[string]string{"RTPROXY_STATE_DIR": "st"}), map[string]string{"rules_dir": "r"})
	if err != nil {
		t.Fatal(err)
	}
	if c.RulesDir != "r" || c.StateDir != "st" {
		t.Fatalf("rules_dir %s state_dir %s", c.RulesDir, c.StateDir)
	}
}

func TestUnknownEnv(t *testing.T) {
	got := UnknownEnv([]string{"RTPROXY_LISTEN=a:1", "RTPROXY_LISTN=a:1", "PATH=/bin", "RTPROXY_CONFIG=f", "RTPROXY_TLS_UPSTREAM_CAFILE=x", "RTPROXY_SASL_PASSWORD=p"}, "RTPROXY_CONFIG")
	if strings.Join(got, ",") != "RTPROXY_LISTN,RTPROXY_TLS_UPSTREAM_CAFILE" {
		t.Fatalf("got %q", got)
	}
}

// The default redaction pattern catches the usual credential headers in
// any case and spelling, and leaves ordinary ones alone.
func TestRedactPattern(t *testing.T) {
	re, err := Default().Admin.RedactPattern()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Authorization", "proxy-authorization", "X-Auth-Token", "x-api-key", "API_KEY", "apikey",
		"Cookie", "Set-Cookie", "x-session-id", "client_secret", "password", "X-Passwd", "aws-credentials", "x-signature", "private-key"} {
		if !re.MatchString(name) {
			t.Errorf("%q is not redacted by default", name)
		}
	}
	for _, name := range []string{"x-trace-id", "content-type", "traceparent", "tenant", "user-agent", "rtproxy-window"} {
		if re.MatchString(name) {
			t.Errorf("%q is redacted by default", name)
		}
	}
	c := Default()
	if err := c.ApplyEnv(env(map[string]string{"RTPROXY_ADMIN_SHOW_RECORDS": "true", "RTPROXY_ADMIN_REDACT_HEADERS": "^x-secret$"})); err != nil {
		t.Fatal(err)
	}
	re, err = c.Admin.RedactPattern()
	if err != nil || !c.Admin.ShowRecords || !re.MatchString("X-Secret") || re.MatchString("authorization") {
		t.Fatalf("from the environment: show_records %v, pattern %v %v", c.Admin.ShowRecords, re, err)
	}
}

// The per-record budgets (issue 25) are configurable and validated.
func TestLimitsKeys(t *testing.T) {
	c := Default()
	if err := c.Parse("l.yaml", []byte("limits:\n  expr_memory_bytes: 1048576\n  expr_steps: 5000\n  expr_time: 20ms\n  max_fanout: 50\n  max_open_windows: 7\n")); err != nil {
		t.Fatal(err)
	}
	want := Limits{ExprMemoryBytes: 1 << 20, ExprSteps: 5000, ExprTime: 20 * time.Millisecond, MaxFanout: 50, MaxOpenWindows: 7}
	if c.Limits != want {
		t.Fatalf("limits %+v, want %+v", c.Limits, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Limits = Limits{ExprMemoryBytes: 10, ExprSteps: 0, ExprTime: 0, MaxFanout: 0, MaxOpenWindows: -1}
	err := c.Validate()
	for _, k := range []string{"limits.expr_memory_bytes", "limits.expr_steps", "limits.expr_time", "limits.max_fanout", "limits.max_open_windows"} {
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s not refused: %v", k, err)
		}
	}
}

// Issue 25, finding 7: the config file's aliases have the same budget as
// every other YAML file rtproxy reads.
func TestConfigAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("x0: &a0 [x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "x%d: &a%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", i-1), 9), ", "))
	}
	err := Default().Parse("rtproxy.yaml", []byte(b.String()))
	if err == nil || !strings.HasPrefix(err.Error(), "rtproxy.yaml:7:") || !strings.Contains(err.Error(), "aliases here expand to more than") {
		t.Fatalf("got %v, want the alias budget refusing line 7", err)
	}
}

func TestRulesAllowValidate(t *testing.T) {
	c := Default()
	if err := c.Parse("ok", []byte("rules:\n  allow:\n    env: [SR_TOKEN, SR_*]\n    files: [/etc/rtproxy/secrets, /run/*.token]\n    urls: [https://registry.internal:8081, http://sr/v1]\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("a good allow-list is refused: %v", err)
	}
	if !reflect.DeepEqual(c.Rules.Allow.Env, []string{"SR_TOKEN", "SR_*"}) {
		t.Fatalf("env %q", c.Rules.Allow.Env)
	}
	for body, want := range map[string]string{
		"rules: {allow: {env: [\"*\"]}}":             "rules.allow.env[0]: \"*\" would let rule files read every environment variable",
		"rules: {allow: {env: [\"A-B\"]}}":           "is not an environment variable name",
		"rules: {allow: {files: [secrets]}}":         "rules.allow.files[0]: \"secrets\" must be an absolute path",
		"rules: {allow: {files: [/]}}":               "would let rule files read every file",
		"rules: {allow: {urls: [registry:8081]}}":    "rules.allow.urls[0]: \"registry:8081\" must start with http:// or https://",
		"rules: {allow: {urls: [\"http://u:p@r\"]}}": "holds credentials",
	} {
		c := Default()
		if err := c.Parse("bad", []byte(body)); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", body, err, want)
		}
	}
}
