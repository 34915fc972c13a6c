package integration

// The schema registry over TLS with a private CA (schema_registry.ca_file),
// through the binary: the registry (internal/srembed, the handler
// test/srfakebroker serves) listens with a certificate of a CA generated
// here. With the CA file the route reads the Avro records; with another
// CA it refuses the registry's certificate, the records wait (nothing is
// dropped) and /routes says why.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/rtproxy/rtproxy/internal/srembed"
)

// testCA is a CA generated for one test and a server certificate it signs
// for 127.0.0.1.
type testCA struct {
	caPEM  []byte
	server tls.Certificate
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rtproxy test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "registry"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{
		caPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		server: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
	}
}

func TestSchemaRegistryOverTLSWithCAFile(t *testing.T) {
	ca := newTestCA(t)
	other := newTestCA(t)
	dir, rulesDir := t.TempDir(), t.TempDir()
	// The proxy's CA file anywhere; a rule file's inside the rules
	// directory (rules.allow).
	caFile, otherFile := filepath.Join(dir, "registry-ca.pem"), filepath.Join(rulesDir, "other-ca.pem")
	if err := os.WriteFile(caFile, ca.caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(otherFile, other.caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := srembed.Open("", "")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.server}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	// The wrong-CA route's refused handshakes are expected: not logged.
	srv := &http.Server{Handler: reg.Handler(), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "https://" + ln.Addr().String()

	// The schema registered over TLS, by a client that trusts the CA.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.caPEM)
	cl, err := sr.NewClient(sr.URLs(url), sr.HTTPClient(&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := cl.CreateSchema(t.Context(), "tls.avro-value", sr.Schema{Schema: itOutAvsc, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	var serde sr.Serde
	sch := avro.MustParse(itOutAvsc)
	serde.Register(ss.ID, itOut{}, sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(sch, v) }))

	// The route trusting the registry's CA (the proxy's ca_file), and one
	// whose own schema_registry names another CA.
	WriteRuleFile(t, rulesDir, "tls.yaml", "route: tls-avro\nsource: { topic: tls.avro, format: avro }\nsink: { topic: tls.avro.out }\n")
	WriteRuleFile(t, rulesDir, "wrong-ca.yaml", "route: tls-wrong-ca\nsource: { topic: tls.avro, format: avro }\nsink: { topic: tls.avro.never }\n"+
		"schema_registry: { url: \""+url+"\", ca_file: other-ca.pem }\n")
	s := StartStack(t, KfakeOpts{Topics: map[string]int{"tls.avro": 1}},
		ProxyOpts{RulesDir: rulesDir, Env: []string{"RTPROXY_SCHEMA_REGISTRY_URL=" + url, "RTPROXY_SCHEMA_REGISTRY_CA_FILE=" + caFile}})
	m := "m1"
	v, err := serde.Encode(itOut{ID: "x1", Amount: 2.5, Currency: "USD", Merchant: &m})
	if err != nil {
		t.Fatal(err)
	}
	if err := NewClient(t, s.Bootstrap).ProduceSync(t.Context(), &kgo.Record{Topic: "tls.avro", Key: []byte("x1"), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	assertValues(t, "route over TLS", sinkValues(t, s.Bootstrap, "tls.avro.out", 1), map[string]string{
		"x1": `{"amount":2.5,"currency":"USD","id":"x1","merchant":"m1"}`,
	})
	if s.Proxy == nil {
		return
	}
	// The other CA: the record waits, and /routes says the certificate is
	// not trusted.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(s.Proxy.AdminURL + "/routes")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var routes []map[string]any
		json.Unmarshal(b, &routes)
		var last string
		for _, r := range routes {
			if r["name"] == "tls-wrong-ca" || r["route"] == "tls-wrong-ca" {
				last, _ = r["last_error"].(string)
			}
		}
		if strings.Contains(last, "certificate") && strings.Contains(last, "waits at offset 0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the route with the wrong CA: last_error %q; /routes:\n%s", last, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := ConsumeQuiet(t, s.Bootstrap, "tls.avro.never", 0, 300*time.Millisecond, time.Second); len(got) > 0 {
		t.Errorf("the route that cannot verify the registry wrote %d records", len(got))
	}
}
