package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func readFixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mutate replaces old with new in s, failing if old is not there: a
// mutation that silently does nothing would make its case pass vacuously.
func mutate(t *testing.T, s, old, new string) string {
	t.Helper()
	if !strings.Contains(s, old) {
		t.Fatalf("fixture has no %q", old)
	}
	return strings.ReplaceAll(s, old, new)
}

func TestManifestFixtureIsClean(t *testing.T) {
	m, err := ParseManifest([]byte(readFixture(t, "standalone.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Check(1); len(got) != 0 {
		t.Fatalf("the rendered chart fixture has problems:\n%s", strings.Join(got, "\n"))
	}
	dir := t.TempDir()
	n, err := m.WriteRules(dir)
	if err != nil || n != 1 {
		t.Fatalf("WriteRules = %d, %v; want 1 file", n, err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "r.yaml"))
	want, _ := os.ReadFile("../testdata/dashboard-route.yaml")
	if strings.TrimSpace(string(got)) != strings.TrimSpace(string(want)) {
		t.Errorf("extracted rule file differs from the one rendered in:\n%s\n---\n%s", got, want)
	}
}

func TestManifestMismatches(t *testing.T) {
	fixture := readFixture(t, "standalone.yaml")
	cases := []struct {
		name, old, new string
		pods           int
		want           string
	}{
		{"readiness path", "path: /readyz", "path: /ready", 1,
			`readinessProbe path "/ready", want "/readyz"`},
		{"liveness on bootstrap port", "path: /healthz\n              port: admin", "path: /healthz\n              port: bootstrap", 1,
			"livenessProbe port bootstrap is not the admin port 9644"},
		{"rules via subPath", "mountPath: /etc/rtproxy/rules\n", "mountPath: /etc/rtproxy/rules\n              subPath: r.yaml\n", 1,
			"ConfigMap edits would never reach the hot reload"},
		{"rules from another ConfigMap", "configMap:\n            name: rtp-rtproxy-rules\n", "configMap:\n            name: someone-elses-rules\n", 1,
			"mounts ConfigMap someone-elses-rules, but the rendered rules are in rtp-rtproxy-rules"},
		{"service port off the range", "port: 9095\n", "port: 9195\n", 1,
			"ports 9092-9094,9096,9195,9644, but the config listens on 9092-9096,9644"},
		{"container port moved", "containerPort: 9095", "containerPort: 9099", 1,
			"port 9095 goes to container port 9099"},
		{"config range shrinks", "broker_port_count: 4", "broker_port_count: 3", 1,
			"containerPorts 9092-9096,9644, but the config listens on 9092-9095,9644"},
		{"admin on loopback", `admin_listen: "0.0.0.0:9644"`, `admin_listen: "127.0.0.1:9644"`, 1,
			"the kubelet probes the pod IP"},
		{"config the proxy refuses", "max_frame_bytes: 104857600", "max_frame_bytes: 10", 1,
			"max_frame_bytes: 10 is outside 1024"},
		{"unknown config key", "log_format: json", "log_fromat: json", 1,
			"the proxy's config loader refuses"},
		{"sasl password not from a secret", "- name: RTPROXY_SASL_PASSWORD", "- name: SASL_PASSWORD", 1,
			"no RTPROXY_SASL_PASSWORD from a secretKeyRef"},
		{"sasl password in the ConfigMap", `username: "u"`, "username: \"u\"\n      password: hunter2", 1,
			"sasl.password is written into ConfigMap rtp-rtproxy-config"},
		{"tls secret mounted elsewhere", "mountPath: /etc/rtproxy/tls/upstream", "mountPath: /etc/tls", 1,
			"tls.upstream.ca_file /etc/rtproxy/tls/upstream/ca.crt is not inside a mounted Secret"},
		{"writable root", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", 1,
			"readOnlyRootFilesystem is not true"},
		{"state on the root filesystem", "mountPath: /var/lib/rtproxy", "mountPath: /var/lib/other", 1,
			"state_dir /var/lib/rtproxy is not a mount"},
		{"wrong command", "- run\n", "- serve\n", 1,
			"want [run --config PATH]"},
		{"service monitor port", "- port: admin\n", "- port: metrics\n", 1,
			`endpoint port "metrics" is not the admin port 9644`},
		{"advertises another service", `advertise_host: "rtp-rtproxy.kafka.svc"`, `advertise_host: "other.kafka.svc"`, 1,
			`advertise_host "other.kafka.svc" names another Service`},
		{"no workload expected", "", "", 0,
			`want 0 pod template(s) with a "rtproxy" container, found 1`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := fixture
			if c.old != "" {
				s = mutate(t, fixture, c.old, c.new)
			}
			m, err := ParseManifest([]byte(s))
			if err != nil {
				t.Fatal(err)
			}
			got := m.Check(c.pods)
			found := false
			for _, p := range got {
				found = found || strings.Contains(p, c.want)
			}
			if !found {
				t.Errorf("want a problem containing %q, got:\n%s", c.want, strings.Join(got, "\n"))
			}
		})
	}
}

func TestManifestNoConfig(t *testing.T) {
	m, err := ParseManifest([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := m.Check(0)
	if len(got) != 1 || !strings.Contains(got[0], "want exactly 1 ConfigMap with component=config") {
		t.Errorf("got %q", got)
	}
	if _, err := ParseManifest([]byte("---\n---\n")); err == nil || !strings.Contains(err.Error(), "no Kubernetes objects") {
		t.Errorf("empty render: err = %v", err)
	}
}

func TestParseRepoDockerfile(t *testing.T) {
	f, err := os.Open("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	df, err := ParseDockerfile(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(df.Stages) != 2 || df.Stages[0].Image != "golang:1.26-bookworm" || df.Stages[0].Name != "build" || df.Stages[1].Image != StaticBase {
		t.Errorf("stages = %+v", df.Stages)
	}
	bc, err := df.GoBuild()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(bc.Env, []string{"CGO_ENABLED=0"}) || bc.Output != "/out/rtproxy" || bc.Package != "./cmd/rtproxy" ||
		bc.LDFlags != "-s -w -X main.version=${VERSION}" || !slices.Contains(bc.Args, "-trimpath") {
		t.Errorf("build command = %+v", bc)
	}
}

func TestShellWords(t *testing.T) {
	cases := []struct {
		in   string
		want []string
		err  string
	}{
		{`go build -o x ./a`, []string{"go", "build", "-o", "x", "./a"}, ""},
		{`A=1  go  build -ldflags "-s -w -X main.v=${V}" .`, []string{"A=1", "go", "build", "-ldflags", "-s -w -X main.v=${V}", "."}, ""},
		{`echo 'a "b"' ""`, []string{"echo", `a "b"`, ""}, ""},
		{`x "open`, nil, `unterminated " quote`},
	}
	for _, c := range cases {
		got, err := shellWords(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("shellWords(%q) err = %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("shellWords(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestIgnoredBy(t *testing.T) {
	patterns := []string{".git", "bin/", "test/", "**/node_modules", "*.test", "deploy/helm/", "!deploy/helm/keep.txt"}
	cases := map[string]string{
		"cmd/rtproxy/x.go":                "",
		"test/kfakebroker/x.go":           "test/",
		"bin/helm":                        "bin/",
		"deploy/docker/rtproxy.yaml":      "",
		"deploy/helm/rtproxy/values.yaml": "deploy/helm/",
		"deploy/helm/keep.txt":            "",
		"a/b/node_modules/c.js":           "**/node_modules",
		"protocol.test":                   "*.test",
		"go.mod":                          "",
		"testing/x.go":                    "",
	}
	for path, want := range cases {
		if got := ignoredBy(patterns, path); got != want {
			t.Errorf("ignoredBy(%q) = %q, want %q", path, got, want)
		}
	}
}

// imageCheck runs CheckImage from the module root (it runs go list there)
// on a Dockerfile given as text.
func imageCheck(t *testing.T, root, rendered, dockerfile, dockerignore string) []string {
	t.Helper()
	dir := t.TempDir()
	df := filepath.Join(dir, "Dockerfile")
	di := filepath.Join(dir, ".dockerignore")
	os.WriteFile(df, []byte(dockerfile), 0o644)
	os.WriteFile(di, []byte(dockerignore), 0o644)
	t.Chdir(root)
	var log bytes.Buffer
	problems, err := CheckImage(ImageCheck{
		Dockerfile: df, Dockerignore: di, Rendered: rendered,
		ImageConfig: "deploy/deploycheck/testdata/image-config.yaml", Log: &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	return problems
}

func TestImageAgainstChart(t *testing.T) {
	dockerfile := readFixture(t, "Dockerfile.small")
	ignore := ".git\nbin/\ntest/\n**/node_modules\n"
	root, _ := filepath.Abs("../..")
	rendered, _ := filepath.Abs("testdata/standalone.yaml")
	if got := imageCheck(t, root, rendered, dockerfile, ignore); len(got) != 0 {
		t.Fatalf("the testdata Dockerfile and chart agree, but got:\n%s", strings.Join(got, "\n"))
	}
	cases := []struct {
		name, old, new, ignore, want string
	}{
		{"root user", "USER 65532:65532", "USER root", "", "USER root, want 65532:65532"},
		{"debian base", "FROM gcr.io/distroless/static-debian12:nonroot", "FROM debian:12", "", "final stage FROM debian:12"},
		{"cgo on", "CGO_ENABLED=0 go build", "go build", "", "without CGO_ENABLED=0"},
		{"no trimpath", "go build -trimpath", "go build", "", "go build without -trimpath"},
		{"no version stamp", " -X main.version=${VERSION}", "", "", "does not stamp -X main.version"},
		{"command differs", `CMD ["run", "--config", "/etc/rtproxy/rtproxy.yaml"]`, `CMD ["run"]`, "", `CMD ["run"] but the chart runs the container with args ["run" "--config" "/etc/rtproxy/rtproxy.yaml"]`},
		{"ports differ", "EXPOSE 9092 9093-9096 9644", "EXPOSE 9092 9644", "", "EXPOSE 9092,9644, but the chart's default config listens on 9092-9096,9644"},
		{"state volume elsewhere", `VOLUME ["/var/lib/rtproxy"]`, `VOLUME ["/data"]`, "", `VOLUME ["/data"], want exactly the chart's state_dir "/var/lib/rtproxy"`},
		{"rules dir not owned", "COPY --from=build --chown=65532:65532 /out/etc/rtproxy/rules", "COPY --from=build /out/etc/rtproxy/rules", "", "/etc/rtproxy/rules is not --chown=65532:65532"},
		{"entrypoint elsewhere", `ENTRYPOINT ["/usr/local/bin/rtproxy"]`, `ENTRYPOINT ["/bin/rtproxy"]`, "", "ENTRYPOINT /bin/rtproxy is not the go build output /out/rtproxy"},
		{"ignore hides a package", "", "", "config/\n", `pattern "config/" leaves config out of the build context`},
		{"ignore hides the config", "", "", "deploy/\n", `leaves deploy/deploycheck/testdata/image-config.yaml out`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := dockerfile
			if c.old != "" {
				d = mutate(t, dockerfile, c.old, c.new)
			}
			got := imageCheck(t, root, rendered, d, ignore+c.ignore)
			found := false
			for _, p := range got {
				found = found || strings.Contains(p, c.want)
			}
			if !found {
				t.Errorf("want a problem containing %q, got:\n%s", c.want, strings.Join(got, "\n"))
			}
		})
	}
}

func TestManifestReplicas(t *testing.T) {
	fixture := readFixture(t, "standalone.yaml")
	m, err := ParseManifest([]byte(mutate(t, fixture, "replicas: 1\n", "replicas: 3\n")))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.CheckReplicas(3); len(got) != 0 {
		t.Errorf("3 replicas, want 3: %q", got)
	}
	if got := m.CheckReplicas(1); len(got) != 1 || !strings.Contains(got[0], "Deployment/rtp-rtproxy: replicas 3, want 1") {
		t.Errorf("3 replicas, want 1: %q", got)
	}
	// No spec.replicas is Kubernetes' default of 1.
	m, err = ParseManifest([]byte(mutate(t, fixture, "replicas: 1\n", "")))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.CheckReplicas(1); len(got) != 0 {
		t.Errorf("replicas unset, want 1: %q", got)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"manifest", "-rendered", "testdata/standalone.yaml", "-replicas", "3"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "replicas 1, want 3") {
		t.Errorf("-replicas 3 on a 1-replica rendering: exit %d, stderr %s", code, errb.String())
	}
}

func TestRunExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"manifest", "-rendered", "testdata/standalone.yaml"}, &out, &errb); code != 0 {
		t.Errorf("clean fixture: exit %d, stderr %s", code, errb.String())
	}
	bad := mutate(t, readFixture(t, "standalone.yaml"), "path: /readyz", "path: /nope")
	p := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(p, []byte(bad), 0o644)
	errb.Reset()
	if code := run([]string{"manifest", "-rendered", p}, &out, &errb); code != 1 || !strings.Contains(errb.String(), `readinessProbe path "/nope"`) {
		t.Errorf("bad fixture: exit %d, stderr %s", code, errb.String())
	}
	if code := run([]string{"bogus"}, &out, &errb); code != 2 {
		t.Errorf("unknown command: exit %d", code)
	}
}

func FuzzParseDockerfile(f *testing.F) {
	for _, name := range []string{"../../Dockerfile", "testdata/Dockerfile.small"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("FROM a AS b\nRUN x \\\n  y\n# c\nARG V=1\n")
	f.Add("RUN \"unterminated go build\n")
	f.Fuzz(func(t *testing.T, s string) {
		df, err := ParseDockerfile(strings.NewReader(s))
		if err != nil {
			return
		}
		if len(df.Stages) == 0 {
			t.Fatal("parsed without a stage")
		}
		for _, in := range df.Instructions {
			if in.Cmd == "" || in.Line < 1 {
				t.Fatalf("bad instruction %+v", in)
			}
		}
		df.GoBuild()
		for _, in := range df.Instructions {
			execForm(in)
		}
	})
}

func FuzzShellWords(f *testing.F) {
	f.Add(`CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/rtproxy ./cmd/rtproxy`)
	f.Add(`'a b' "c'd" e`)
	f.Fuzz(func(t *testing.T, s string) {
		words, err := shellWords(s)
		if err != nil {
			return
		}
		// Words without quotes or blanks survive a join and a re-split.
		var plain []string
		for _, w := range words {
			if w != "" && !strings.ContainsAny(w, "\"' \t") {
				plain = append(plain, w)
			}
		}
		again, err := shellWords(strings.Join(plain, " "))
		if err != nil || !slices.Equal(again, plain) {
			t.Fatalf("re-split of %q = %q, %v", plain, again, err)
		}
	})
}

func FuzzManifestCheck(f *testing.F) {
	b, err := os.ReadFile("testdata/standalone.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b))
	f.Add("kind: ConfigMap\nmetadata: {labels: {app.kubernetes.io/component: config}}\ndata: {rtproxy.yaml: 'listen: x'}\n")
	f.Add("kind: Deployment\nspec: {template: {spec: {containers: [{name: rtproxy, ports: 3}], volumes: [1, {name: v}]}}}\n")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseManifest([]byte(s))
		if err != nil {
			return
		}
		m.Check(1)
	})
}
