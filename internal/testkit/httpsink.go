package testkit

import (
	"bufio"
	"bytes"
	cryptotls "crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// HTTPSinkServer is test/httpsinkserver running as its own process: the
// endpoint an HTTP sink writes to in tests.
type HTTPSinkServer struct {
	URL    string // base URL, http(s)://127.0.0.1:PORT
	CAFile string // with TLS: the CA its certificate is signed by
	cmd    *exec.Cmd
	cl     *http.Client
}

// HTTPSinkRequest is one request the server recorded.
type HTTPSinkRequest struct {
	Seq     int               `json:"seq"`
	Time    time.Time         `json:"time"`
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Key     string            `json:"key"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	Status  int               `json:"status"` // 0: reset
}

// StartHTTPSinkServer builds and starts test/httpsinkserver (HTTPS with a
// CA of its own when tls); it is killed when the test ends.
func StartHTTPSinkServer(t testing.TB, tls bool) *HTTPSinkServer {
	t.Helper()
	bin := startBuild("./test/httpsinkserver", "httpsinkserver", nil).wait(t, "httpsinkserver")
	s := &HTTPSinkServer{}
	args := []string{"-addr", "127.0.0.1:0"}
	if tls {
		s.CAFile = filepath.Join(t.TempDir(), "ca.pem")
		args = append(args, "-tls-ca-out", s.CAFile)
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = ChildAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.cmd = cmd
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("httpsinkserver did not start: %v %s", err, stderr.String())
	}
	s.URL = strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	s.cl = &http.Client{Timeout: 10 * time.Second}
	if tls {
		// The test reads its control endpoints over the same TLS.
		s.cl.Transport = caTransport(t, s.CAFile)
	}
	return s
}

// Control sends the server a control message (see test/httpsinkserver).
func (s *HTTPSinkServer) Control(t testing.TB, c map[string]any) {
	t.Helper()
	b, _ := json.Marshal(c)
	resp, err := s.cl.Post(s.URL+"/_control", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("httpsinkserver control: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("httpsinkserver control %s: %s", b, resp.Status)
	}
}

// Requests returns every request recorded so far, in arrival order.
func (s *HTTPSinkServer) Requests(t testing.TB) []HTTPSinkRequest {
	t.Helper()
	resp, err := s.cl.Get(s.URL + "/_requests")
	if err != nil {
		t.Fatalf("httpsinkserver requests: %v", err)
	}
	defer resp.Body.Close()
	var out []HTTPSinkRequest
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		var r HTTPSinkRequest
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("httpsinkserver requests: %v", err)
		}
		out = append(out, r)
	}
	return out
}

// Acked returns the requests answered with a 2xx.
func Acked(rs []HTTPSinkRequest) []HTTPSinkRequest {
	var out []HTTPSinkRequest
	for _, r := range rs {
		if r.Status >= 200 && r.Status < 300 {
			out = append(out, r)
		}
	}
	return out
}

func (r HTTPSinkRequest) String() string {
	return fmt.Sprintf("#%d %s %s key=%s status=%d body=%s", r.Seq, r.Method, r.Path, r.Key, r.Status, r.Body)
}

func caTransport(t testing.TB, caFile string) *http.Transport {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s: no certificate", caFile)
	}
	return &http.Transport{TLSClientConfig: &cryptotls.Config{RootCAs: pool, MinVersion: cryptotls.VersionTLS12}}
}
