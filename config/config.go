// Package config owns the proxy's own configuration: the YAML file, its
// defaults (all in Default), its conflicts (all in Validate), and the
// RTPROXY_* environment overrides. Command-line flags are applied by the
// caller (cmd/rtproxy) on top, so the precedence is
// flags > environment > file > defaults.
//
// It may import only the standard library and the YAML parser; it must never
// import protocol/, pipeline/ or rules/, which consume what it produces.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Config is the whole proxy configuration. Every leaf field has a yaml key;
// its environment variable is RTPROXY_ followed by the key path in upper case
// joined by underscores (tls.upstream.ca_file → RTPROXY_TLS_UPSTREAM_CA_FILE).
type Config struct {
	// Listen is the bootstrap address clients dial. Default 127.0.0.1:9092.
	Listen string `yaml:"listen"`
	// AdvertiseHost is the host clients are told to reach the per-broker
	// listeners on. Default 127.0.0.1.
	AdvertiseHost string `yaml:"advertise_host"`
	// BrokerPorts is the first port of the per-broker listener range.
	// Default 9093.
	BrokerPorts int `yaml:"broker_ports"`
	// BrokerPortCount is the size of that range. Default 100.
	BrokerPortCount int `yaml:"broker_port_count"`
	// Upstream lists the seed brokers (host:port). Empty starts an
	// embedded 3-broker kfake cluster, for development only.
	Upstream []string `yaml:"upstream"`
	// RulesDir holds one YAML rule file per route. Default ./rules.
	RulesDir string `yaml:"rules_dir"`
	// TablesDir is a directory whose files rule files' tables may name,
	// besides the rules directory. Empty (default): table files must be
	// inside the rules directory.
	TablesDir string `yaml:"tables_dir"`
	// StateDir holds pebble state, checkpoints and the embedded broker's
	// data. Default ./state.
	StateDir string `yaml:"state_dir"`
	// AdminListen serves /metrics, /healthz, /readyz and /routes.
	// Default 127.0.0.1:9644.
	AdminListen string `yaml:"admin_listen"`
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level"`
	// LogFormat is text or json. Default text.
	LogFormat string `yaml:"log_format"`
	// MaxFrameBytes caps one Kafka frame, in bytes. Default 104857600
	// (100 MiB, Kafka's socket.request.max.bytes).
	MaxFrameBytes int64 `yaml:"max_frame_bytes"`
	// ShutdownGrace bounds how long in-flight requests and pipelines get
	// to finish after SIGTERM. Default 10s.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// StateRetention is how long the state of a route whose rule file is
	// gone is kept; past it the state is dropped and a restored file starts
	// from source.start. Default 0: kept until `rtproxy state drop ROUTE`.
	StateRetention time.Duration `yaml:"state_retention"`
	// GroupProtocol is how a route's instances share its partitions:
	// "auto" (KIP-848 when every broker speaks ConsumerGroupHeartbeat v1,
	// else the classic protocol with cooperative-sticky), "consumer"
	// (KIP-848 only) or "classic". Default auto.
	GroupProtocol string `yaml:"group_protocol"`
	// GroupSessionTimeout is how long a route's group waits for a silent
	// instance before moving its partitions (session.timeout.ms of the
	// classic protocol; KIP-848 brokers use their own setting). Default 10s.
	GroupSessionTimeout time.Duration `yaml:"group_session_timeout"`
	// BatchWindow is how long a route lets the records of its source
	// gather at the brokers while records flow, and its outputs in its
	// producer until the poll that made them is run: fewer fetch and
	// produce requests, and less CPU per record, for up to about this much
	// added latency (pipeline.Config.BatchWindow). 0, the default: off,
	// poll at once and write at once (the one meaning of "off", here and
	// in the pipeline).
	BatchWindow time.Duration `yaml:"batch_window"`
	// Pprof serves Go's profiles (net/http/pprof) under /debug/pprof/ on
	// admin_listen. Default false: a profile costs CPU while it is taken,
	// and the endpoint shows the command line.
	Pprof bool `yaml:"pprof"`

	Proxy ProxyLimits `yaml:"proxy"`
	Admin Admin       `yaml:"admin"`
	TLS   TLS         `yaml:"tls"`
	SASL  SASL        `yaml:"sasl"`

	SchemaRegistry SchemaRegistry `yaml:"schema_registry"`

	// Limits are the per-record budgets of rule expressions and steps.
	Limits Limits `yaml:"limits"`

	Rules Rules `yaml:"rules"`
}

// Rules is what the proxy lets rule files name. A rule file is written by
// whoever may edit the rules directory, the config by whoever runs the
// proxy: a rule file may make the proxy read only these secrets and send
// them only to these URLs (rules.Allow; docs/OPERATIONS.md, "What rule
// files may name").
type Rules struct {
	Allow RulesAllow `yaml:"allow"`
}

// RulesAllow is the allow-list. Empty lists (the default) allow no
// environment variable, token and CA files inside the rules directory
// only, and only the proxy's own schema_registry.url.
type RulesAllow struct {
	// Env lists environment variable names rule files may name
	// (schema_registry.basic_auth_env, bearer_token_env), exact or with
	// `*` (SR_*).
	Env []string `yaml:"env"`
	// Files lists absolute paths rule files may name as token, password
	// or CA files besides the rules directory: a directory allows every
	// file beneath it; otherwise a file or a glob (/etc/rtproxy/*.token),
	// matched against the resolved path.
	Files []string `yaml:"files"`
	// URLs lists URL prefixes rule files may send requests to besides the
	// proxy's own schema_registry.url, e.g. https://registry.internal:8081.
	URLs []string `yaml:"urls"`
}

// SchemaRegistry is the Confluent-API schema registry routes with
// `source.format: avro | protobuf` read their schemas from (a rule file's
// own `schema_registry:` overrides it). Secrets are never written here:
// they are read from a file or an environment variable named here.
type SchemaRegistry struct {
	URL             string        `yaml:"url"`               // http(s)://host:port; several comma-separated
	BasicAuthFile   string        `yaml:"basic_auth_file"`   // a file holding user:password
	BasicAuthEnv    string        `yaml:"basic_auth_env"`    // an environment variable holding user:password
	BearerTokenFile string        `yaml:"bearer_token_file"` // a file holding a bearer token
	BearerTokenEnv  string        `yaml:"bearer_token_env"`  // an environment variable holding one
	CAFile          string        `yaml:"ca_file"`           // CA for the registry's certificate; empty: system roots
	Timeout         time.Duration `yaml:"timeout"`           // one request; default 10s
	// Bounds on what a registry may send (internal/serde, docs/SECURITY.md):
	// a schema over one is refused and its records are dead letters. They
	// apply to rule files' own registries too, which cannot raise them.
	MaxResponseBytes int64 `yaml:"max_response_bytes"` // one answer; default 8 MiB
	MaxSchemaBytes   int   `yaml:"max_schema_bytes"`   // a schema and its references, together; default 1 MiB
	MaxSchemaDepth   int   `yaml:"max_schema_depth"`   // nesting of its text; default 64
	MaxReferences    int   `yaml:"max_references"`     // references through the whole tree; default 64
}

// Admin tunes what the status page on admin_listen shows.
type Admin struct {
	// ShowRecords shows the key and value (their first 1 KiB) of each
	// route's recent dead letters on its status page. Default false: only
	// their metadata and headers, so the page holds no record contents.
	ShowRecords bool `yaml:"show_records"`
	// RedactHeaders is a regular expression matched, case-insensitively
	// and anywhere in the name, against the header names of the recent
	// dead letters; a matching header's value is never kept nor shown.
	// Default DefaultRedactHeaders. An empty pattern matches every name.
	RedactHeaders string `yaml:"redact_headers"`
	// AllowedHosts are the names the admin listener answers under besides
	// its own address, IP literals and localhost: a request whose Host
	// header names another is refused (421), so a DNS-rebinding page
	// cannot read it. Exact names, or "*.example.com" for any name under
	// example.com. Default none.
	AllowedHosts []string `yaml:"allowed_hosts"`
}

// DefaultRedactHeaders names the headers whose values the status page
// never shows: credentials and session identifiers.
const DefaultRedactHeaders = `auth|token|secret|passw|cookie|api[-_]?key|access[-_]?key|jwt|bearer|session|credential|signature|private`

// RedactPattern compiles RedactHeaders as it is matched: case-insensitive,
// unanchored.
func (a Admin) RedactPattern() (*regexp.Regexp, error) {
	if _, err := regexp.Compile(a.RedactHeaders); err != nil {
		return nil, err // the error quotes the pattern as it was written
	}
	return regexp.Compile("(?i)" + a.RedactHeaders)
}

// ProxyLimits bound what client connections may hold.
type ProxyLimits struct {
	// MaxConnections caps the client connections open at once; one more
	// is closed at accept and counted. 0: no cap. Default 10000.
	MaxConnections int `yaml:"max_connections"`
	// MaxHeldBytes bounds the bytes of frames the proxy holds whole in
	// memory to rewrite them (large Fetch responses), all connections
	// together; a frame waits while they are used up. 0: no bound.
	MaxHeldBytes int64 `yaml:"max_held_bytes"`
	// MaxDecodedBytes bounds what one guarded or tapped Produce request's
	// records may cost once decompressed and decoded (their bytes, plus 80
	// bytes per record and 40 per header); decompression stops there and
	// the partition is refused with MESSAGE_TOO_LARGE. Default 32 MiB.
	MaxDecodedBytes int64 `yaml:"max_decoded_bytes"`
	// MaxRecordsPerRequest bounds the records of one guarded or tapped
	// Produce request (MESSAGE_TOO_LARGE past it). Default 200000.
	MaxRecordsPerRequest int `yaml:"max_records_per_request"`
	// MaxDecodedBytesTotal bounds what all decodes in progress hold at
	// once; a decode waits for room. At least max_decoded_bytes. Default
	// 128 MiB.
	MaxDecodedBytesTotal int64 `yaml:"max_decoded_bytes_total"`
	// ClientIdleTimeout closes a client connection with no request and no
	// response for this long while nothing is in flight (Kafka's
	// connections.max.idle.ms). 0: never. Default 10m.
	ClientIdleTimeout time.Duration `yaml:"client_idle_timeout"`
	// RequestReadTimeout closes a client connection whose request has not
	// fully arrived this long after its first 4 KiB. 0: never. Default 60s.
	RequestReadTimeout time.Duration `yaml:"request_read_timeout"`
	// Tap hands records produced through the proxy with acks=all to the
	// routes of this instance that read them, when the brokers acknowledge
	// them, instead of a fetch later. Default false: measured, it saved no
	// latency on brokers whose fetches wait for data (docs/BENCHMARKS.md),
	// and it reads every Produce request whole.
	Tap bool `yaml:"tap"`
}

// TLS holds both sides of TLS, each configured on its own.
type TLS struct {
	Client   ClientTLS   `yaml:"client"`
	Upstream UpstreamTLS `yaml:"upstream"`
}

// ClientTLS terminates TLS from clients. Empty CertFile means plaintext.
type ClientTLS struct {
	CertFile          string `yaml:"cert_file"`
	KeyFile           string `yaml:"key_file"`
	ClientCAFile      string `yaml:"client_ca_file"`
	RequireClientCert bool   `yaml:"require_client_cert"`
}

// Enabled reports whether client-side TLS is configured.
func (c ClientTLS) Enabled() bool { return c.CertFile != "" }

// UpstreamTLS originates TLS toward the brokers.
type UpstreamTLS struct {
	Enabled            bool   `yaml:"enabled"`
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
	// ForwardIdentity presents cert_file on the connections the proxy
	// opens for its clients too, not only on its own (the pipelines'):
	// every proxied client then acts with the proxy's broker identity. It
	// is refused unless the listener is loopback or clients are
	// authenticated (tls.client.require_client_cert). Default false.
	ForwardIdentity bool `yaml:"forward_identity"`
}

// SASL is the proxy's own upstream identity, used by the connections it
// opens itself (the pipelines). Client SASL is forwarded, never replaced.
type SASL struct {
	Mechanism string `yaml:"mechanism"` // PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty: none
	Username  string `yaml:"username"`
	Password  string `yaml:"password"`
}

// SASL mechanisms the proxy can speak upstream.
const (
	MechPlain       = "PLAIN"
	MechScramSHA256 = "SCRAM-SHA-256"
	MechScramSHA512 = "SCRAM-SHA-512"
)

// Default returns the configuration used when nothing else is given. It is
// the only place defaults live.
func Default() *Config {
	return &Config{
		Listen:              "127.0.0.1:9092",
		AdvertiseHost:       "127.0.0.1",
		BrokerPorts:         9093,
		BrokerPortCount:     100,
		Upstream:            nil,
		RulesDir:            "./rules",
		StateDir:            "./state",
		AdminListen:         "127.0.0.1:9644",
		LogLevel:            "info",
		LogFormat:           "text",
		MaxFrameBytes:       100 << 20,
		ShutdownGrace:       10 * time.Second,
		GroupProtocol:       "auto",
		GroupSessionTimeout: 10 * time.Second,
		Admin:               Admin{RedactHeaders: DefaultRedactHeaders},
		SchemaRegistry: SchemaRegistry{Timeout: 10 * time.Second, MaxResponseBytes: 8 << 20, MaxSchemaBytes: 1 << 20,
			MaxSchemaDepth: 64, MaxReferences: 64},
		Limits: Limits{
			ExprMemoryBytes: 32 << 20,
			ExprSteps:       1_000_000,
			ExprTime:        100 * time.Millisecond,
			MaxFanout:       100_000,
			MaxOpenWindows:  1_000_000,
		},
		Proxy: ProxyLimits{
			MaxConnections:       10000,
			MaxHeldBytes:         256 << 20,
			MaxDecodedBytes:      32 << 20,
			MaxRecordsPerRequest: 200_000,
			MaxDecodedBytesTotal: 128 << 20,
			ClientIdleTimeout:    10 * time.Minute,
			RequestReadTimeout:   60 * time.Second,
		},
	}
}

// Embedded reports whether no upstream is configured, which means the proxy
// runs its own in-process development cluster.
func (c *Config) Embedded() bool { return len(c.Upstream) == 0 }

// Validate checks every field and every conflict between fields, and returns
// all problems at once (joined), each naming its key.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}

	listenPort, err := hostPort(c.Listen)
	if err != nil {
		bad("listen", "%v", err)
	}
	adminPort, err := hostPort(c.AdminListen)
	if err != nil {
		bad("admin_listen", "%v", err)
	}
	if c.AdvertiseHost == "" {
		bad("advertise_host", "must not be empty")
	} else if strings.ContainsAny(c.AdvertiseHost, ":/ ") && net.ParseIP(c.AdvertiseHost) == nil {
		bad("advertise_host", "%q is not a host name or IP address (no port)", c.AdvertiseHost)
	}

	rangeOK := true
	if c.BrokerPorts < 1 || c.BrokerPorts > 65535 {
		bad("broker_ports", "%d is not a port (1-65535)", c.BrokerPorts)
		rangeOK = false
	}
	if c.BrokerPortCount < 1 {
		bad("broker_port_count", "must be at least 1, got %d", c.BrokerPortCount)
		rangeOK = false
	}
	if rangeOK {
		last := c.BrokerPorts + c.BrokerPortCount - 1
		if last > 65535 {
			bad("broker_port_count", "range %d-%d runs past port 65535", c.BrokerPorts, last)
		}
		inRange := func(p int) bool { return p >= c.BrokerPorts && p <= last }
		if listenPort > 0 && inRange(listenPort) {
			bad("listen", "port %d is inside the broker port range %d-%d", listenPort, c.BrokerPorts, last)
		}
		if adminPort > 0 && inRange(adminPort) {
			bad("admin_listen", "port %d is inside the broker port range %d-%d", adminPort, c.BrokerPorts, last)
		}
	}
	if listenPort > 0 && listenPort == adminPort {
		bad("admin_listen", "port %d is also the listen port", adminPort)
	}

	for i, u := range c.Upstream {
		if p, err := hostPort(u); err != nil {
			bad(fmt.Sprintf("upstream[%d]", i), "%v", err)
		} else if p == 0 {
			bad(fmt.Sprintf("upstream[%d]", i), "%q: port 0 is not a broker port", u)
		}
	}
	if c.RulesDir == "" {
		bad("rules_dir", "must not be empty")
	}
	if c.StateDir == "" {
		bad("state_dir", "must not be empty")
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "warning", "error":
	default:
		bad("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	switch strings.ToLower(c.LogFormat) {
	case "text", "json":
	default:
		bad("log_format", "%q is not one of text, json", c.LogFormat)
	}
	if c.MaxFrameBytes < 1024 || c.MaxFrameBytes > math.MaxInt32 {
		bad("max_frame_bytes", "%d is outside 1024..%d", c.MaxFrameBytes, math.MaxInt32)
	}
	if c.ShutdownGrace <= 0 {
		// Zero would read as "the default" to the parts; a stop without a
		// grace is better asked for as a small one, such as 100ms.
		bad("shutdown_grace", "must be positive (e.g. 10s, or 100ms for an almost immediate stop), got %s", c.ShutdownGrace)
	}
	switch c.GroupProtocol {
	case "auto", "consumer", "classic":
	default:
		bad("group_protocol", "%q is not one of auto, consumer, classic", c.GroupProtocol)
	}
	if c.GroupSessionTimeout < time.Second || c.GroupSessionTimeout > 30*time.Minute {
		bad("group_session_timeout", "must be between 1s and 30m (e.g. 10s), got %s", c.GroupSessionTimeout)
	}
	if c.BatchWindow < 0 || c.BatchWindow > time.Second {
		bad("batch_window", "must be between 0 (off) and 1s (e.g. 5ms), got %s", c.BatchWindow)
	}
	c.Limits.validate(bad)
	if c.Proxy.MaxHeldBytes < 0 {
		bad("proxy.max_held_bytes", "must be 0 (no bound) or positive, got %d", c.Proxy.MaxHeldBytes)
	}
	if c.Proxy.MaxDecodedBytes < 1<<10 {
		bad("proxy.max_decoded_bytes", "must be at least 1024, got %d", c.Proxy.MaxDecodedBytes)
	}
	if c.Proxy.MaxRecordsPerRequest < 1 {
		bad("proxy.max_records_per_request", "must be positive, got %d", c.Proxy.MaxRecordsPerRequest)
	}
	if c.Proxy.MaxDecodedBytesTotal < c.Proxy.MaxDecodedBytes {
		bad("proxy.max_decoded_bytes_total", "must be at least proxy.max_decoded_bytes (%d), got %d", c.Proxy.MaxDecodedBytes, c.Proxy.MaxDecodedBytesTotal)
	}
	if c.Proxy.MaxConnections < 0 {
		bad("proxy.max_connections", "must be 0 (no cap) or positive, got %d", c.Proxy.MaxConnections)
	}
	if c.Proxy.ClientIdleTimeout < 0 {
		bad("proxy.client_idle_timeout", "must be 0 (never) or positive (e.g. 10m), got %s", c.Proxy.ClientIdleTimeout)
	}
	if c.Proxy.RequestReadTimeout < 0 {
		bad("proxy.request_read_timeout", "must be 0 (never) or positive (e.g. 60s), got %s", c.Proxy.RequestReadTimeout)
	}
	if _, err := c.Admin.RedactPattern(); err != nil {
		bad("admin.redact_headers", "%q is not a regular expression: %v", c.Admin.RedactHeaders, err)
	}
	if c.StateRetention < 0 {
		bad("state_retention", "must be 0 (keep until `rtproxy state drop`) or positive (e.g. 24h), got %s", c.StateRetention)
	}

	ct := c.TLS.Client
	if (ct.CertFile == "") != (ct.KeyFile == "") {
		bad("tls.client", "cert_file and key_file must be set together")
	}
	if ct.CertFile == "" && (ct.ClientCAFile != "" || ct.RequireClientCert) {
		bad("tls.client", "client_ca_file/require_client_cert need cert_file and key_file (client TLS is off)")
	}
	if ct.RequireClientCert && ct.ClientCAFile == "" {
		bad("tls.client.require_client_cert", "needs client_ca_file to verify client certificates against")
	}

	ut := c.TLS.Upstream
	if (ut.CertFile == "") != (ut.KeyFile == "") {
		bad("tls.upstream", "cert_file and key_file must be set together")
	}
	if !ut.Enabled && (ut.CAFile != "" || ut.CertFile != "" || ut.ServerName != "" || ut.InsecureSkipVerify) {
		bad("tls.upstream", "ca_file/cert_file/key_file/server_name/insecure_skip_verify are set but enabled is false")
	}
	if ut.ForwardIdentity && ut.CertFile == "" {
		bad("tls.upstream.forward_identity", "needs cert_file: there is no client certificate to forward")
	}
	if ut.ForwardIdentity && !ct.RequireClientCert && !loopbackListen(c.Listen) {
		bad("tls.upstream.forward_identity", "would hand the proxy's broker identity (its client certificate) to every client that can reach %s; authenticate clients (tls.client.require_client_cert) or listen on loopback", c.Listen)
	}
	if ut.Enabled && c.Embedded() {
		bad("tls.upstream.enabled", "the embedded development broker speaks plaintext; set upstream or disable upstream TLS")
	}

	s := c.SASL
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.Password != "" {
			bad("sasl.mechanism", "username/password are set but no mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
		}
	case MechPlain, MechScramSHA256, MechScramSHA512:
		if s.Username == "" {
			bad("sasl.username", "required with mechanism %s", s.Mechanism)
		}
		if c.Embedded() {
			bad("sasl.mechanism", "the embedded development broker has no SASL; set upstream or remove sasl")
		}
	default:
		bad("sasl.mechanism", "%q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", s.Mechanism)
	}

	c.SchemaRegistry.validate(bad)
	c.Rules.Allow.validate(bad)

	return errors.Join(errs...)
}

func (s SchemaRegistry) validate(bad func(key, format string, args ...any)) {
	if s.URL == "" {
		if s.BasicAuthFile != "" || s.BasicAuthEnv != "" || s.BearerTokenFile != "" || s.BearerTokenEnv != "" || s.CAFile != "" {
			bad("schema_registry.url", "required when other schema_registry settings are given")
		}
	}
	for _, u := range strings.Split(s.URL, ",") {
		u = strings.TrimSpace(u)
		if s.URL == "" {
			break
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			bad("schema_registry.url", "%q must start with http:// or https://", u)
		} else if i := strings.Index(u, "://"); strings.Contains(u[i+3:], "@") {
			bad("schema_registry.url", "holds credentials; name them in basic_auth_file or basic_auth_env instead")
		}
	}
	basic := s.BasicAuthFile != "" || s.BasicAuthEnv != ""
	bearer := s.BearerTokenFile != "" || s.BearerTokenEnv != ""
	switch {
	case basic && bearer:
		bad("schema_registry", "basic auth and a bearer token are both set; use one")
	case s.BasicAuthFile != "" && s.BasicAuthEnv != "":
		bad("schema_registry.basic_auth_env", "basic_auth_file is set too; use one")
	case s.BearerTokenFile != "" && s.BearerTokenEnv != "":
		bad("schema_registry.bearer_token_env", "bearer_token_file is set too; use one")
	}
	if s.Timeout <= 0 {
		bad("schema_registry.timeout", "must be positive (e.g. 10s), got %s", s.Timeout)
	}
	// The bounds: 0 takes the default; none can be switched off.
	if s.MaxResponseBytes < 0 {
		bad("schema_registry.max_response_bytes", "must be positive, got %d", s.MaxResponseBytes)
	}
	if s.MaxSchemaBytes < 0 {
		bad("schema_registry.max_schema_bytes", "must be positive, got %d", s.MaxSchemaBytes)
	}
	if s.MaxSchemaDepth < 0 || s.MaxSchemaDepth > 10000 {
		bad("schema_registry.max_schema_depth", "must be between 1 and 10000, got %d", s.MaxSchemaDepth)
	}
	if s.MaxReferences < 0 {
		bad("schema_registry.max_references", "must be positive, got %d", s.MaxReferences)
	}
}

var envNameRe = regexp.MustCompile(`^[A-Za-z_*][A-Za-z0-9_*]*$`)

func (a RulesAllow) validate(bad func(key, format string, args ...any)) {
	for i, e := range a.Env {
		if !envNameRe.MatchString(e) {
			bad(fmt.Sprintf("rules.allow.env[%d]", i), "%q is not an environment variable name (letters, digits, _; `*` matches any run)", e)
		} else if strings.Trim(e, "*") == "" {
			bad(fmt.Sprintf("rules.allow.env[%d]", i), "%q would let rule files read every environment variable of the proxy; list the names", e)
		}
	}
	for i, f := range a.Files {
		switch {
		case !strings.HasPrefix(f, "/"):
			bad(fmt.Sprintf("rules.allow.files[%d]", i), "%q must be an absolute path", f)
		case strings.Trim(f, "/*") == "":
			bad(fmt.Sprintf("rules.allow.files[%d]", i), "%q would let rule files read every file the proxy can; name a directory of secrets for rules", f)
		}
	}
	for i, u := range a.URLs {
		p, err := url.Parse(u)
		switch {
		case err != nil || (p.Scheme != "http" && p.Scheme != "https"):
			bad(fmt.Sprintf("rules.allow.urls[%d]", i), "%q must start with http:// or https://", u)
		case p.Host == "":
			bad(fmt.Sprintf("rules.allow.urls[%d]", i), "%q has no host", u)
		case p.User != nil:
			bad(fmt.Sprintf("rules.allow.urls[%d]", i), "%q holds credentials", u)
		}
	}
}

// hostPort checks a host:port address and returns its port. An empty host
// (":9092") means every interface and is allowed.
func hostPort(addr string) (int, error) {
	if addr == "" {
		return 0, errors.New("must not be empty (want host:port)")
	}
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("%q is not host:port: %v", addr, stripAddrErr(err))
	}
	p, err := strconv.Atoi(ps)
	if err != nil || p < 0 || p > 65535 {
		return 0, fmt.Errorf("%q: port %q is not 0-65535", addr, ps)
	}
	return p, nil
}

// stripAddrErr drops net.AddrError's repetition of the address we already
// print.
func stripAddrErr(err error) string {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return ae.Err
	}
	return err.Error()
}

// Redacted returns a copy safe to print or log: secrets are replaced.
func (c *Config) Redacted() *Config {
	cp := *c
	cp.Upstream = append([]string(nil), c.Upstream...)
	if cp.SASL.Password != "" {
		cp.SASL.Password = "REDACTED"
	}
	return &cp
}

// loopbackListen reports whether addr (host:port) listens on loopback only.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Limits are the per-record budgets of what rule files make the proxy do
// (operators/budget.go): an expression of a guard check or a route step,
// and the records and window updates one input record may cause. A record
// over one is refused (a guard) or a dead letter with reason `budget` (a
// route), counted in rtproxy_budget_exceeded_total{budget}.
type Limits struct {
	// ExprMemoryBytes bounds the bytes one evaluation of an expression
	// may build with repeat, split, join, replace, toJSON, `+` and the
	// other built-ins that allocate in proportion to their input,
	// charged before they allocate. Default 32 MiB.
	ExprMemoryBytes int64 `yaml:"expr_memory_bytes"`
	// ExprSteps bounds the predicate iterations (all, any, map, filter,
	// reduce, ...) and sort comparisons of one evaluation. Default 1e6.
	ExprSteps int64 `yaml:"expr_steps"`
	// ExprTime bounds the wall time of one evaluation. Default 100ms.
	ExprTime time.Duration `yaml:"expr_time"`
	// MaxFanout bounds the records and window updates one input record
	// causes along a route's steps (explode copies times the windows each
	// updates). Default 100000.
	MaxFanout int64 `yaml:"max_fanout"`
	// MaxOpenWindows bounds the open window states (window × key) of one
	// window step on one partition. Default 1000000.
	MaxOpenWindows int64 `yaml:"max_open_windows"`
}

func (l Limits) validate(bad func(key, format string, args ...any)) {
	if l.ExprMemoryBytes < 1024 {
		bad("limits.expr_memory_bytes", "must be at least 1024, got %d", l.ExprMemoryBytes)
	}
	if l.ExprSteps < 1000 {
		bad("limits.expr_steps", "must be at least 1000, got %d", l.ExprSteps)
	}
	if l.ExprTime < time.Millisecond {
		bad("limits.expr_time", "must be at least 1ms, got %v", l.ExprTime)
	}
	if l.MaxFanout < 1 {
		bad("limits.max_fanout", "must be at least 1, got %d", l.MaxFanout)
	}
	if l.MaxOpenWindows < 1 {
		bad("limits.max_open_windows", "must be at least 1, got %d", l.MaxOpenWindows)
	}
}
