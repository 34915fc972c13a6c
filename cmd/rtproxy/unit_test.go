package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/pipeline"
)

func TestAdminEndpoints(t *testing.T) {
	reg := newRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "rtproxy_test_things_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	a, err := newAdmin("127.0.0.1:0", reg, slog.New(slog.DiscardHandler), false)
	if err != nil {
		t.Fatal(err)
	}
	go a.serve()
	defer a.srv.Close()
	base := "http://" + a.Addr()
	if resp, err := http.Get(base + "/debug/pprof/"); err != nil || resp.StatusCode != 404 {
		t.Fatalf("/debug/pprof/ without pprof: %v %v, want 404", resp, err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "not ready: starting") {
		t.Fatalf("/readyz before wiring: %d %q", code, body)
	}
	var ready atomic.Bool
	a.setReady(func() (bool, string) { return ready.Load(), "upstream metadata not fetched yet" })
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "upstream metadata not fetched yet") {
		t.Fatalf("/readyz not ready: %d %q", code, body)
	}
	ready.Store(true)
	if code, body := get("/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz ready: %d %q", code, body)
	}
	a.stopping.Store(true)
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "shutting down") {
		t.Fatalf("/readyz stopping: %d %q", code, body)
	}

	if code, body := get("/routes"); code != 200 || body != "[]\n" {
		t.Fatalf("/routes without a manager: %d %q", code, body)
	}
	var nilSlice []string
	a.setRoutes(func() any { return nilSlice })
	if code, body := get("/routes"); code != 200 || body != "[]\n" {
		t.Fatalf("/routes typed nil: %d %q", code, body)
	}
	a.setRoutes(func() any { return []map[string]string{{"name": "r1"}} })
	code, body := get("/routes")
	var got []map[string]string
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil || len(got) != 1 || got[0]["name"] != "r1" {
		t.Fatalf("/routes: %d %q (%v)", code, body, err)
	}

	code, body = get("/metrics")
	for _, want := range []string{"rtproxy_test_things_total 3", "go_goroutines", "process_cpu_seconds_total", `rtproxy_build_info{goversion="go`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	if resp, err := http.Post(base+"/healthz", "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /healthz: %v %v", resp, err)
	}
}

// writeCert writes a self-signed CA-capable certificate and its key.
func writeCert(t *testing.T, dir, name string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(mrand.Int64N(1 << 60)),
		Subject:               pkix.Name{CommonName: name},
		DNSNames:              []string{name},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return certFile, keyFile, cert
}

func TestTLSConfigs(t *testing.T) {
	dir := t.TempDir()
	crt, key, cert := writeCert(t, dir, "proxy.test")
	caCrt, _, ca := writeCert(t, dir, "ca.test")
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("not pem"), 0o600)

	if tc, err := clientTLS(config.ClientTLS{}); tc != nil || err != nil {
		t.Fatalf("client TLS off: %v %v", tc, err)
	}
	tc, err := clientTLS(config.ClientTLS{CertFile: crt, KeyFile: key, ClientCAFile: caCrt, RequireClientCert: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(tc.Certificates) != 1 || tc.ClientAuth != tls.RequireAndVerifyClientCert || tc.ClientCAs == nil {
		t.Fatalf("client TLS: %+v", tc)
	}
	if leaf, _ := x509.ParseCertificate(tc.Certificates[0].Certificate[0]); leaf.Subject.CommonName != cert.Subject.CommonName {
		t.Fatalf("client TLS serves %q", leaf.Subject.CommonName)
	}
	tc, _ = clientTLS(config.ClientTLS{CertFile: crt, KeyFile: key, ClientCAFile: caCrt})
	if tc.ClientAuth != tls.VerifyClientCertIfGiven {
		t.Fatalf("CA without require: ClientAuth %v", tc.ClientAuth)
	}
	if _, err := clientTLS(config.ClientTLS{CertFile: crt, KeyFile: caCrt}); err == nil || !strings.Contains(err.Error(), "tls.client: load cert_file/key_file") {
		t.Fatalf("mismatched key: %v", err)
	}
	if _, err := clientTLS(config.ClientTLS{CertFile: crt, KeyFile: key, ClientCAFile: junk}); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Fatalf("junk CA: %v", err)
	}

	if tc, err := upstreamTLS(config.UpstreamTLS{}); tc != nil || err != nil {
		t.Fatalf("upstream TLS off: %v %v", tc, err)
	}
	ut, err := upstreamTLS(config.UpstreamTLS{Enabled: true, CAFile: caCrt, CertFile: crt, KeyFile: key, ServerName: "kafka.test"})
	if err != nil {
		t.Fatal(err)
	}
	if ut.ServerName != "kafka.test" || len(ut.Certificates) != 1 || ut.InsecureSkipVerify {
		t.Fatalf("upstream TLS: %+v", ut)
	}
	if _, err := ca.Verify(x509.VerifyOptions{Roots: ut.RootCAs}); err != nil {
		t.Fatalf("upstream RootCAs do not hold the CA: %v", err)
	}
	if _, err := upstreamTLS(config.UpstreamTLS{Enabled: true, CAFile: filepath.Join(dir, "missing.crt")}); err == nil || !strings.Contains(err.Error(), "tls.upstream.ca_file") {
		t.Fatalf("missing CA: %v", err)
	}
}

func TestPipelineClientOpts(t *testing.T) {
	for _, tc := range []struct {
		mech string
		tls  bool
		want int
	}{{"", false, 0}, {"", true, 1}, {config.MechPlain, false, 1}, {config.MechScramSHA256, true, 2}, {config.MechScramSHA512, false, 1}} {
		c := config.Default()
		c.SASL = config.SASL{Mechanism: tc.mech, Username: "u", Password: "p"}
		var tcfg *tls.Config
		if tc.tls {
			tcfg = &tls.Config{ServerName: "k"}
		}
		opts, err := pipelineClientOpts(c, tcfg)
		if err != nil || len(opts) != tc.want {
			t.Errorf("%s tls=%v: %d opts (%v), want %d", tc.mech, tc.tls, len(opts), err, tc.want)
		}
	}
	c := config.Default()
	c.SASL.Mechanism = "GSSAPI"
	if _, err := pipelineClientOpts(c, nil); err == nil || !strings.Contains(err.Error(), `"GSSAPI" is not supported`) {
		t.Fatalf("unknown mechanism: %v", err)
	}
}

func TestSamplePayments(t *testing.T) {
	r := mrand.New(mrand.NewPCG(1, 2))
	now := time.UnixMilli(1_700_000_000_000)
	statuses, merchants, users := map[string]int{}, map[string]int{}, map[string]bool{}
	for i := range 2000 {
		p := samplePayment(r, i, now)
		b, _ := json.Marshal(p)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"txn_id", "user_id", "merchant_id", "amount", "status", "ts"} {
			if _, ok := m[f]; !ok {
				t.Fatalf("record %d lacks %s: %s", i, f, b)
			}
		}
		if p.Amount < 1 || p.Amount > 501 || m["ts"].(float64) != 1_700_000_000_000 {
			t.Fatalf("record %d out of range: %s", i, b)
		}
		statuses[p.Status]++
		merchants[p.MerchantID]++
		users[p.UserID] = true
	}
	if len(merchants) != 4 || merchants["m1"] < 400 || merchants["m4"] < 400 || len(users) != 20 {
		t.Fatalf("merchants %v, %d users", merchants, len(users))
	}
	// Roughly 5% test, 10% declined: enough of each for the quickstart's filters.
	if statuses["test"] < 50 || statuses["declined"] < 100 || statuses["ok"] < 1500 {
		t.Fatalf("status mix %v", statuses)
	}
}

func TestParseRunFlags(t *testing.T) {
	env := map[string]string{"RTPROXY_LISTEN": "127.0.0.1:2000", "RTPROXY_STATE_DIR": "/env/state"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	var stderr bytes.Buffer
	cfg, printCfg, err := parseRun([]string{"--listen", "127.0.0.1:3000", "--upstream=a:1,b:2", "--broker-ports", "20000",
		"--rules-dir", "/r", "--advertise-host", "h", "--admin-listen", "127.0.0.1:4000", "--log-level", "debug", "--print-config"}, lookup, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !printCfg || cfg.Listen != "127.0.0.1:3000" || cfg.StateDir != "/env/state" || cfg.RulesDir != "/r" || cfg.BrokerPorts != 20000 ||
		cfg.AdvertiseHost != "h" || cfg.AdminListen != "127.0.0.1:4000" || cfg.LogLevel != "debug" || strings.Join(cfg.Upstream, ",") != "a:1,b:2" {
		t.Fatalf("got %+v", cfg)
	}
	if _, _, err := parseRun([]string{"--broker-ports", "many"}, lookup, &stderr); err == nil || !strings.Contains(err.Error(), `"many" is not an integer`) {
		t.Fatalf("bad flag value: %v", err)
	}
	if _, _, err := parseRun([]string{"--nope"}, lookup, &stderr); err == nil || !strings.Contains(err.Error(), "flag provided but not defined: -nope") {
		t.Fatalf("unknown flag: %v", err)
	}
	if _, _, err := parseRun([]string{"extra"}, lookup, &stderr); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Fatalf("positional: %v", err)
	}
}

// The proxy's upstream client certificate is its own broker identity: the
// pipelines present it, the connections opened for proxied clients do not,
// unless tls.upstream.forward_identity says so (issue 10).
func TestProxiedTLSWithoutTheProxyIdentity(t *testing.T) {
	own := &tls.Config{ServerName: "kafka.test", Certificates: []tls.Certificate{{Certificate: [][]byte{{1}}}}}
	p := proxiedTLS(own, false)
	if len(p.Certificates) != 0 || p.ServerName != "kafka.test" {
		t.Errorf("proxied connections: %d certificates, server name %q; want none and the same server name", len(p.Certificates), p.ServerName)
	}
	if len(own.Certificates) != 1 {
		t.Error("the proxy's own config lost its certificate")
	}
	if f := proxiedTLS(own, true); len(f.Certificates) != 1 {
		t.Error("forward_identity: the proxied connections do not present the certificate")
	}
	if proxiedTLS(nil, false) != nil {
		t.Error("plaintext upstream became TLS")
	}
}

// pprof is off by default, on with --pprof (no value needed), --pprof=false
// keeps it off, and RTPROXY_PPROF=true turns it on; when on, the admin
// listener serves Go's profile index and a CPU profile.
func TestPprofOptIn(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	env := func(k string) (string, bool) {
		if k == "RTPROXY_PPROF" {
			return "true", true
		}
		return "", false
	}
	for _, tc := range []struct {
		args   []string
		lookup func(string) (string, bool)
		want   bool
	}{
		{nil, none, false},
		{[]string{"--pprof"}, none, true},
		{[]string{"--pprof=false"}, env, false},
		{nil, env, true},
	} {
		var stderr strings.Builder
		cfg, _, err := parseRun(tc.args, tc.lookup, &stderr)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if cfg.Pprof != tc.want {
			t.Errorf("args %v: pprof %v, want %v", tc.args, cfg.Pprof, tc.want)
		}
	}
	a, err := newAdmin("127.0.0.1:0", newRegistry(), slog.New(slog.DiscardHandler), true)
	if err != nil {
		t.Fatal(err)
	}
	go a.serve()
	defer a.srv.Close()
	for path, want := range map[string]string{"/debug/pprof/": "goroutine", "/debug/pprof/profile?seconds=1": ""} {
		resp, err := http.Get("http://" + a.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) || len(b) == 0 {
			t.Errorf("GET %s: %d, %d bytes", path, resp.StatusCode, len(b))
		}
	}
}

// The status page at / renders the routes and the metrics for people: the
// route's state, partitions, dead letters and latency, the proxy's
// connections and request rates, guards; errors are escaped, not markup.
func TestStatusPage(t *testing.T) {
	reg := newRegistry()
	conns := prometheus.NewGauge(prometheus.GaugeOpts{Name: "rtproxy_proxy_connections_open", Help: "h"})
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtproxy_proxy_requests_total", Help: "h"}, []string{"api"})
	dls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtproxy_pipeline_dead_letters_total", Help: "h"}, []string{"route", "reason"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rtproxy_pipeline_processing_latency_seconds", Help: "h",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}, []string{"route"})
	guard := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rtproxy_guard_rejected_records_total", Help: "h"}, []string{"guard", "check"})
	reg.MustRegister(conns, reqs, dls, lat, guard)
	conns.Set(3)
	reqs.WithLabelValues("Produce").Add(10)
	dls.WithLabelValues("payments-risk", "decode").Add(2)
	for range 98 {
		lat.WithLabelValues("payments-risk").Observe(0.0009) // bucket ≤ 1.6 ms
	}
	lat.WithLabelValues("payments-risk").Observe(0.2) // bucket ≤ 204.8 ms
	lat.WithLabelValues("payments-risk").Observe(0.2)
	guard.WithLabelValues("payments-shape", "positive").Add(4)
	a, err := newAdmin("127.0.0.1:0", reg, slog.New(slog.DiscardHandler), false)
	if err != nil {
		t.Fatal(err)
	}
	go a.serve()
	defer a.srv.Close()
	cp := time.Now().Add(-2 * time.Second)
	a.setReady(func() (bool, string) { return true, "" })
	a.setRoutes(func() any {
		return []pipeline.RouteStatus{{Name: "payments-risk", File: "/rules/payments-risk.yaml", Source: "payments", Sink: "payments.risk",
			State: "running", Delivery: "exactly_once", Group: "rtproxy.payments-risk", Protocol: "consumer", Generation: 4,
			LastCheckpoint: &cp, LastError: "<script>alert(1)</script>",
			Owned:       []pipeline.OwnedPartition{{Topic: "payments", Partition: 2, DoneOffset: 120, Lag: 7}},
			Transaction: &pipeline.TxnStatus{State: "open", Commits: 12, Aborts: 1}}}
	})
	get := func() string {
		t.Helper()
		resp, err := http.Get("http://" + a.Addr() + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return string(b)
	}
	get()
	reqs.WithLabelValues("Produce").Add(5)
	page := get()
	for _, want := range []string{
		"<h1>rtproxy status</h1>", `http-equiv="refresh"`, "payments-risk", "state-running", "exactly_once",
		"payments → payments.risk", "<th scope=\"col\">", "120", ">7<", "decode", "≤ 1.60 ms / ≤ 204.80 ms",
		"open, 12 commits, 1 aborts", "payments-shape", "positive", ">3<", "Produce",
		"&lt;script&gt;alert(1)&lt;/script&gt;",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the status page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "<script>") {
		t.Errorf("an error message reached the page as markup")
	}
	if resp, err := http.Get("http://" + a.Addr() + "/nope"); err != nil || resp.StatusCode != 404 {
		t.Errorf("GET /nope: %v %v, want 404", resp, err)
	}
}
