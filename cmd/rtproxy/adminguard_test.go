package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/rtproxy/rtproxy/config"
)

// adminRequest sends method path to the admin listener at addr with the
// given Host and headers, and returns the status and body.
func adminRequest(t *testing.T, addr, method, path, host string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminChecksHost: a DNS-rebinding page reaches the admin listener
// with its own name in the Host header; the listener answers only under
// its address, IP literals, localhost names and admin.allowed_hosts, and
// refuses others with 421 (issue 25).
func TestAdminChecksHost(t *testing.T) {
	reg := newRegistry()
	a, err := newAdmin("127.0.0.1:0", reg, slog.New(slog.DiscardHandler), false)
	if err != nil {
		t.Fatal(err)
	}
	a.allowHosts([]string{"rtproxy.monitoring.svc", "*.internal.example"})
	go a.serve()
	defer a.srv.Close()
	_, port, _ := strings.Cut(a.Addr(), ":")
	for host, want := range map[string]int{
		"":                                    200,
		"127.0.0.1:" + port:                   200,
		"localhost:" + port:                   200,
		"LOCALHOST":                           200,
		"app.localhost:" + port:               200,
		"[::1]:" + port:                       200,
		"10.1.2.3:" + port:                    200, // a pod IP: kubelet probes
		"rtproxy.monitoring.svc:" + port:      200,
		"RTProxy.Monitoring.Svc.":             200,
		"a.internal.example:" + port:          200,
		"evil.example:" + port:                421,
		"evil.example":                        421,
		"localhost.evil.example:" + port:      421,
		"internal.example.evil.example":       421,
		"127.0.0.1.nip.io:" + port:            421,
		"rtproxy.monitoring.svc.evil:" + port: 421,
	} {
		for _, path := range []string{"/routes", "/metrics", "/"} {
			code, body := adminRequest(t, a.Addr(), "GET", path, host, nil, "")
			if code != want {
				t.Errorf("GET %s with Host %q: %d, want %d (%.80s)", path, host, code, want, body)
			}
			if want == 421 && !strings.Contains(body, "admin.allowed_hosts") {
				t.Errorf("refusal %q does not name admin.allowed_hosts", body)
			}
		}
	}
	if v := testutil.ToFloat64(a.guard.refused.WithLabelValues("host")); v != 6*3 {
		t.Errorf("rtproxy_admin_requests_refused_total{reason=host} = %v, want 18", v)
	}
}

// TestDevRegistrySameOrigin: the development schema registry on the admin
// listener takes writes only from its own origin: a cross-site page's
// simple text/plain POST, or a DELETE naming another Origin, is refused
// with 403 and changes nothing, while franz-go's registry client (and a
// same-origin page) still registers schemas.
func TestDevRegistrySameOrigin(t *testing.T) {
	a, err := newAdmin("127.0.0.1:0", newRegistry(), slog.New(slog.DiscardHandler), false)
	if err != nil {
		t.Fatal(err)
	}
	url, err := startEmbeddedRegistry(a, t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go a.serve()
	defer a.srv.Close()
	schema := `{"schema":"{\"type\":\"string\"}"}`
	post := "/schema-registry/subjects/s/versions"
	for _, tc := range []struct {
		name string
		hdr  map[string]string
	}{
		{"cross-origin text/plain", map[string]string{"Origin": "http://evil.example", "Content-Type": "text/plain"}},
		{"cross-origin json", map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json"}},
		{"null origin", map[string]string{"Origin": "null", "Content-Type": "application/json"}},
		{"cross-site fetch", map[string]string{"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}},
		{"form post", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}},
		{"text/plain, no origin", map[string]string{"Content-Type": "text/plain"}},
	} {
		if code, body := adminRequest(t, a.Addr(), "POST", post, "", tc.hdr, schema); code != 403 {
			t.Errorf("%s: POST %d %s, want 403", tc.name, code, body)
		}
	}
	code, body := adminRequest(t, a.Addr(), "GET", "/schema-registry/subjects", "", nil, "")
	if code != 200 || strings.Contains(body, `"s"`) {
		t.Fatalf("after refused writes the registry lists %d %s", code, body)
	}

	// franz-go's client registers and reads as ever.
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ss, err := cl.CreateSchema(ctx, "orders-value", sr.Schema{Schema: `{"type":"string"}`})
	if err != nil {
		t.Fatalf("franz-go registers a schema: %v", err)
	}
	// A same-origin page may write too.
	same := map[string]string{"Origin": "http://" + a.Addr(), "Content-Type": "application/vnd.schemaregistry.v1+json"}
	if code, body := adminRequest(t, a.Addr(), "POST", post, "", same, schema); code != 200 {
		t.Errorf("same-origin POST: %d %s", code, body)
	}
	// A cross-origin DELETE is refused and the subject stays.
	if code, _ := adminRequest(t, a.Addr(), "DELETE", "/schema-registry/subjects/orders-value", "", map[string]string{"Origin": "http://evil.example"}, ""); code != 403 {
		t.Errorf("cross-origin DELETE: %d, want 403", code)
	}
	if got, err := cl.SchemaByVersion(ctx, "orders-value", ss.Version); err != nil || got.ID != ss.ID {
		t.Errorf("after a refused DELETE: %+v %v", got, err)
	}
	if code, _ := adminRequest(t, a.Addr(), "DELETE", "/schema-registry/subjects/orders-value", "", nil, ""); code != 200 {
		t.Errorf("DELETE from no page: %d, want 200", code)
	}
	if v := testutil.ToFloat64(a.guard.refused.WithLabelValues("origin")); v != 5 {
		t.Errorf("rtproxy_admin_requests_refused_total{reason=origin} = %v, want 5", v)
	}
}

// TestDefaultRedactHeaders: the default admin.redact_headers hides common
// token header names wherever they appear in the name and in any case,
// and leaves ordinary headers shown.
func TestDefaultRedactHeaders(t *testing.T) {
	re, err := config.Default().Admin.RedactPattern()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"x-jwt", "X-JWT-Assertion", "x-bearer", "Bearer", "x-access-key", "X-Access_Key", "accesskey",
		"x-amz-security-token", "token", "X-Client-Secret", "password", "db_passwd", "Cookie", "Set-Cookie", "Authorization",
		"x-api-key", "apikey", "session-id", "x-credential"} {
		if !re.MatchString(name) {
			t.Errorf("header %q is not redacted", name)
		}
	}
	for _, name := range []string{"content-type", "traceparent", "x-request-id", "tenant", "event-type", "x-forwarded-for"} {
		if re.MatchString(name) {
			t.Errorf("header %q is redacted", name)
		}
	}
}

// FuzzAdminHost: the Host check never panics, and lets through only what
// names this listener: an IP literal, a localhost name, the listener's own
// host or an allowed one.
func FuzzAdminHost(f *testing.F) {
	for _, h := range []string{"", "127.0.0.1:9644", "[::1]:1", "localhost", "a.localhost:1", "evil.example", "x.internal.example:80",
		"[fe80::1%eth0]:9", "LOCALHOST.", "::1", "[", ":", "rtproxy.svc:9644"} {
		f.Add(h)
	}
	g := newAdminGuard("0.0.0.0:9644", []string{"rtproxy.svc", "*.internal.example"}, nil, http.NotFoundHandler())
	f.Fuzz(func(t *testing.T, host string) {
		if !g.hostAllowed(host) || host == "" {
			return
		}
		h := host
		if hh, _, err := net.SplitHostPort(host); err == nil {
			h = hh
		}
		h = strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
		if net.ParseIP(h) == nil && h != "localhost" && !strings.HasSuffix(h, ".localhost") && h != "rtproxy.svc" &&
			!strings.HasSuffix(h, ".internal.example") && h != "0.0.0.0" {
			t.Fatalf("Host %q let through", host)
		}
	})
}
