package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// TestBinaryTLSAndSASL runs the binary between TLS on both sides and a
// SASL-enabled cluster: clients reach the proxy over TLS and authenticate to
// the brokers through it (SASL forwarded), the proxy dials the brokers over
// TLS verified against a CA with a server name, and the pipeline uses the
// proxy's own SCRAM identity (password from the environment).
func TestBinaryTLSAndSASL(t *testing.T) {
	dir := t.TempDir()
	brokerCrt, brokerKey, _ := writeCert(t, dir, "kafka.test")
	proxyCrt, proxyKey, _ := writeCert(t, dir, "proxy.test")

	brokerCert, err := tls.LoadX509KeyPair(brokerCrt, brokerKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.DefaultNumPartitions(2),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{brokerCert}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "rtproxy", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, topic := range []string{"secure-in", "secure-out"} {
		if err := c.CreateTopic(topic, 2, nil); err != nil {
			t.Fatal(err)
		}
	}

	rulesDir := filepath.Join(dir, "rules")
	os.MkdirAll(rulesDir, 0o755)
	os.WriteFile(filepath.Join(rulesDir, "secure.yaml"), []byte(
		"route: secure\nsource: { topic: secure-in, format: json, start: earliest }\nsink: { topic: secure-out }\nsteps:\n  - filter: value.ok == true\n"), 0o644)
	conf := filepath.Join(dir, "rtproxy.yaml")
	os.WriteFile(conf, []byte(fmt.Sprintf(`tls:
  client: { cert_file: %s, key_file: %s }
  upstream: { enabled: true, ca_file: %s, server_name: kafka.test }
sasl: { mechanism: SCRAM-SHA-256, username: rtproxy }
`, proxyCrt, proxyKey, brokerCrt)), 0o644)

	p := startRun(t, rulesDir, "--config", conf, "--upstream", strings.Join(c.ListenAddrs(), ","), "RTPROXY_SASL_PASSWORD=s3cret")

	pem, _ := os.ReadFile(proxyCrt)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.listen), kgo.ProducerLinger(0),
		kgo.DialTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: "rtproxy", Pass: "s3cret"}.AsSha256Mechanism()),
		kgo.ConsumeTopics("secure-out"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 20 {
		v := fmt.Sprintf(`{"n":%d,"ok":%v}`, i, i%2 == 0)
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "secure-in", Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %d over TLS+SASL through the proxy: %v", i, err)
		}
	}
	got := map[int]bool{}
	for len(got) < 10 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("sink holds %d of 10 records after 45s", len(got))
		}
		fs.EachRecord(func(r *kgo.Record) {
			var v struct {
				N  int
				OK bool
			}
			if err := json.Unmarshal(r.Value, &v); err != nil || !v.OK || v.N%2 != 0 {
				t.Errorf("sink record %s should not be there (%v)", r.Value, err)
			}
			got[v.N] = true
		})
	}

	// A client without TLS is refused at the proxy's TLS listener; the
	// proxy names the cause in its log.
	plain, err := kgo.NewClient(kgo.SeedBrokers(p.listen), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Second)
	err = plain.Ping(pctx)
	pcancel()
	plain.Close()
	if err == nil {
		t.Fatal("a plaintext client got through the TLS listener")
	}
	cl.Close()
	p.stop(t)
}
