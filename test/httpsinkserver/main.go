// Command httpsinkserver is the endpoint the HTTP sink's tests write to, in
// a process of its own. It records every request (method, path, headers,
// body, and what it answered) and can be told to misbehave: answer 5xx,
// answer slowly, reset connections, or refuse bodies with a 4xx.
//
//	httpsinkserver [-addr 127.0.0.1:0] [-tls-ca-out ca.pem]
//
// It prints "listening <base URL>" on stdout once it accepts requests.
// With -tls-ca-out it serves HTTPS with a certificate for 127.0.0.1 signed
// by a CA it makes up and writes (PEM) to that file.
//
// Control (JSON bodies):
//
//	POST /_control  {"fail": 3, "fail_status": 503}   the next 3 requests get 503
//	                {"slow": 3, "delay": "2s"}         the next 3 answer after 2s
//	                {"reset": 2}                        the next 2 connections are reset (RST)
//	                {"refuse": "poison", "refuse_status": 422}
//	                                                    bodies containing "poison" get 422
//	                {"down": true}                      every request gets 500 until {"down": false}
//	GET  /_requests                                     every request recorded, JSON lines
//
// Every other path is the endpoint: 200 unless told otherwise.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// Request is one recorded request.
type Request struct {
	Seq     int               `json:"seq"`
	Time    time.Time         `json:"time"`
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Key     string            `json:"key"` // Idempotency-Key
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	Status  int               `json:"status"` // 0: the connection was reset
}

type control struct {
	Fail         int    `json:"fail"`
	FailStatus   int    `json:"fail_status"`
	Slow         int    `json:"slow"`
	Delay        string `json:"delay"`
	Reset        int    `json:"reset"`
	Refuse       string `json:"refuse"`
	RefuseStatus int    `json:"refuse_status"`
	Down         *bool  `json:"down"`
}

type server struct {
	mu           sync.Mutex
	reqs         []Request
	fail         int
	failStatus   int
	slow         int
	delay        time.Duration
	reset        int
	refuse       string
	refuseStatus int
	down         bool
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	caOut := flag.String("tls-ca-out", "", "serve HTTPS; write the CA (PEM) to this file")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	s := &server{failStatus: 500, refuseStatus: 400}
	mux := http.NewServeMux()
	mux.HandleFunc("/_control", s.control)
	mux.HandleFunc("/_requests", s.requests)
	mux.HandleFunc("/", s.endpoint)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	scheme := "http"
	if *caOut != "" {
		cfg, err := selfSigned(*caOut)
		if err != nil {
			log.Fatal(err)
		}
		ln = tls.NewListener(ln, cfg)
		scheme = "https"
	}
	fmt.Printf("listening %s://%s\n", scheme, ln.Addr())
	os.Stdout.Sync()
	log.Fatal(hs.Serve(ln))
}

func (s *server) control(w http.ResponseWriter, r *http.Request) {
	var c control
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.Fail > 0 {
		s.fail = c.Fail
		if c.FailStatus != 0 {
			s.failStatus = c.FailStatus
		}
	}
	if c.Slow > 0 {
		d, err := time.ParseDuration(c.Delay)
		if err != nil {
			http.Error(w, "delay: "+err.Error(), http.StatusBadRequest)
			return
		}
		s.slow, s.delay = c.Slow, d
	}
	if c.Reset > 0 {
		s.reset = c.Reset
	}
	if c.Refuse != "" {
		s.refuse = c.Refuse
		if c.RefuseStatus != 0 {
			s.refuseStatus = c.RefuseStatus
		}
	}
	if c.Down != nil {
		s.down = *c.Down
	}
}

func (s *server) requests(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	reqs := append([]Request(nil), s.reqs...)
	s.mu.Unlock()
	enc := json.NewEncoder(w)
	for _, r := range reqs {
		enc.Encode(r)
	}
}

func (s *server) endpoint(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rec := Request{Time: time.Now(), Method: r.Method, Path: r.URL.Path, Key: r.Header.Get("Idempotency-Key"),
		Headers: map[string]string{}, Body: string(body)}
	for k := range r.Header {
		rec.Headers[k] = r.Header.Get(k)
	}
	s.mu.Lock()
	status := http.StatusOK
	var delay time.Duration
	reset := false
	switch {
	case s.reset > 0:
		s.reset--
		reset, status = true, 0
	case s.down:
		status = 500
	case s.fail > 0:
		s.fail--
		status = s.failStatus
	case s.refuse != "" && strings.Contains(string(body), s.refuse):
		status = s.refuseStatus
	}
	if !reset && s.slow > 0 {
		s.slow--
		delay = s.delay
	}
	rec.Seq = len(s.reqs)
	rec.Status = status
	s.reqs = append(s.reqs, rec)
	s.mu.Unlock()

	if reset {
		// An RST, not a clean close: the client sees "connection reset".
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				if tc, ok := underlyingTCP(c); ok {
					tc.SetLinger(0)
				}
				c.Close()
				return
			}
		}
		status = 500
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	w.WriteHeader(status)
}

func underlyingTCP(c net.Conn) (*net.TCPConn, bool) {
	switch x := c.(type) {
	case *net.TCPConn:
		return x, true
	case *tls.Conn:
		tc, ok := x.NetConn().(*net.TCPConn)
		return tc, ok
	}
	return nil, false
}

// selfSigned makes a CA and a certificate for 127.0.0.1 signed by it, and
// writes the CA to caOut.
func selfSigned(caOut string) (*tls.Config, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "httpsinkserver CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(caOut, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, nil
}
