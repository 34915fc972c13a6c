package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/rtproxy/rtproxy/config"
)

// clientTLS builds the server-side TLS the proxy terminates for clients; nil
// when client TLS is off.
func clientTLS(c config.ClientTLS) (*tls.Config, error) {
	if !c.Enabled() {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls.client: load cert_file/key_file: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.ClientCAFile != "" {
		pool, err := loadPool(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.client.client_ca_file: %w", err)
		}
		tc.ClientCAs = pool
		// A CA without require_client_cert verifies certificates that are
		// offered but still admits clients that offer none.
		tc.ClientAuth = tls.VerifyClientCertIfGiven
		if c.RequireClientCert {
			tc.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return tc, nil
}

// upstreamTLS builds the client-side TLS the proxy originates toward the
// brokers; nil when upstream TLS is off.
func upstreamTLS(c config.UpstreamTLS) (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         c.ServerName,
		InsecureSkipVerify: c.InsecureSkipVerify, //nolint:gosec // an explicit operator choice, validated and logged
	}
	if c.CAFile != "" {
		pool, err := loadPool(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.upstream.ca_file: %w", err)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls.upstream: load cert_file/key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// pipelineClientOpts are the franz-go options for the connections the proxy
// opens itself (the pipelines): its own upstream TLS and SASL identity.
// Seeds are passed separately.
func pipelineClientOpts(c *config.Config, tc *tls.Config) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if tc != nil {
		// franz-go clones the config per connection and fills ServerName
		// from the broker host when it is empty.
		opts = append(opts, kgo.DialTLSConfig(tc.Clone()))
	}
	s := c.SASL
	switch s.Mechanism {
	case "":
	case config.MechPlain:
		opts = append(opts, kgo.SASL(plain.Auth{User: s.Username, Pass: s.Password}.AsMechanism()))
	case config.MechScramSHA256:
		opts = append(opts, kgo.SASL(scram.Auth{User: s.Username, Pass: s.Password}.AsSha256Mechanism()))
	case config.MechScramSHA512:
		opts = append(opts, kgo.SASL(scram.Auth{User: s.Username, Pass: s.Password}.AsSha512Mechanism()))
	default:
		return nil, fmt.Errorf("sasl.mechanism %q is not supported", s.Mechanism)
	}
	return opts, nil
}
