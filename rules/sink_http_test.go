package rules

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var httpAllow = &Allow{URLs: []string{"https://api.example.com"}, EnvNames: []string{"API_TOKEN"}}

func loadHTTP(t *testing.T, body string) (*Route, error) {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"r.yaml": body})
	return LoadFileWith(filepath.Join(dir, "r.yaml"), Options{Allow: httpAllow})
}

// A sink.http block loads with its defaults, its headers (plain, and a
// secret named by an environment variable), and names its URL as the
// sink's target.
func TestHTTPSinkSpec(t *testing.T) {
	r, err := loadHTTP(t, `route: hooks
source: { topic: orders }
sink:
  http:
    url: https://api.example.com/v1/orders
    headers:
      X-Tenant: acme
      Authorization: { env: API_TOKEN, prefix: "Bearer " }
      X-Signature: { file: sig.key }
`)
	if err != nil {
		t.Fatal(err)
	}
	h := r.Sink.HTTP
	if h == nil || h.URL != "https://api.example.com/v1/orders" || h.Method != "POST" || h.Timeout != DefaultHTTPTimeout ||
		h.MaxInFlight != DefaultHTTPMaxInFlight || r.Sink.Topic != "" || r.Sink.Target() != h.URL {
		t.Fatalf("sink %+v / %+v", r.Sink, h)
	}
	if len(h.Headers) != 3 || h.Headers[0] != (HTTPHeader{Name: "X-Tenant", Value: "acme"}) ||
		h.Headers[1] != (HTTPHeader{Name: "Authorization", Env: "API_TOKEN", Prefix: "Bearer "}) ||
		h.Headers[2].File == "" || !filepath.IsAbs(h.Headers[2].File) {
		t.Fatalf("headers %+v", h.Headers)
	}
	r, err = loadHTTP(t, "route: h2\nsource: { topic: o }\nsink: { http: { url: https://api.example.com/x, method: PUT, timeout: 2s, max_in_flight: 32 } }\n")
	if err != nil {
		t.Fatal(err)
	}
	if h := r.Sink.HTTP; h.Method != "PUT" || h.Timeout != 2*time.Second || h.MaxInFlight != 32 {
		t.Fatalf("%+v", h)
	}
}

// What an HTTP sink refuses, each with its reason: exactly_once (an HTTP
// endpoint is outside any Kafka transaction), a secret written inline, a
// URL or a variable the proxy's allow-list does not hold, credentials in
// the URL, a topic beside http, a header the sink sets itself, and
// formats that are for topics.
func TestHTTPSinkRefused(t *testing.T) {
	for _, c := range []struct{ name, sink, want string }{
		{"exactly once", "{ http: { url: https://api.example.com/x }, delivery: exactly_once }", "needs a topic sink: an HTTP endpoint cannot take part in a Kafka transaction"},
		{"inline secret", "{ http: { url: https://api.example.com/x, headers: { Authorization: Bearer abc } } }", "the header Authorization carries a secret; read it from a file or an environment variable"},
		{"inline api key", "{ http: { url: https://api.example.com/x, headers: { X-Api-Key: abc } } }", "the header X-Api-Key carries a secret"},
		{"url not allowed", "{ http: { url: https://evil.example.net/x } }", "not allowed by the proxy's rules.allow"},
		{"env not allowed", "{ http: { url: https://api.example.com/x, headers: { Authorization: { env: HOME } } } }", "the environment variable HOME is not allowed"},
		{"file outside", "{ http: { url: https://api.example.com/x, headers: { Authorization: { file: /etc/passwd } } } }", "is outside the rules directory"},
		{"credentials in url", "{ http: { url: \"https://u:p@api.example.com/x\" } }", "holds credentials"},
		{"both", "{ topic: t, http: { url: https://api.example.com/x } }", "sink has `topic` and `http`"},
		{"reserved header", "{ http: { url: https://api.example.com/x, headers: { Idempotency-Key: x } } }", "set by the sink itself"},
		{"format", "{ http: { url: https://api.example.com/x }, format: avro }", "`sink.format` is for a topic sink"},
		{"in flight", "{ http: { url: https://api.example.com/x, max_in_flight: 0 } }", "from 1 to 256"},
		{"scheme", "{ http: { url: ftp://api.example.com/x } }", "must be an http:// or https:// URL"},
		{"env and file", "{ http: { url: https://api.example.com/x, headers: { Authorization: { env: API_TOKEN, file: k } } } }", "has env and file; use one"},
		{"neither", "{ http: { url: https://api.example.com/x, headers: { Authorization: { prefix: x } } } }", "needs `env`"},
		{"unknown key", "{ http: { url: https://api.example.com/x, retries: 3 } }", "unknown field `retries` in sink.http"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadHTTP(t, "route: r\nsource: { topic: o }\nsink: "+c.sink+"\n")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}
