package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/yamlbudget"

	"github.com/rtproxy/rtproxy/config"
)

// ConfigKey is the ConfigMap data key that holds the proxy's config file.
const ConfigKey = "rtproxy.yaml"

// ContainerName is the name the chart gives the proxy container, in both modes.
const ContainerName = "rtproxy"

// obj is one decoded Kubernetes object (or a part of one).
type obj = map[string]any

// Manifest is the decoded output of `helm template`.
type Manifest struct {
	Objects []obj
}

// LoadManifest reads a multi-document YAML file.
func LoadManifest(path string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseManifest(data)
}

// ParseManifest decodes every non-empty YAML document.
func ParseManifest(data []byte) (*Manifest, error) {
	m := &Manifest{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for i := 0; ; i++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if err := yamlbudget.Check(&n); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var o obj
		if err := n.Decode(&o); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if o != nil {
			m.Objects = append(m.Objects, o)
		}
	}
	if len(m.Objects) == 0 {
		return nil, errors.New("no Kubernetes objects in the rendered output")
	}
	return m, nil
}

// --- small accessors over decoded YAML ----------------------------------------

func get(o any, path ...string) any {
	for _, p := range path {
		mm, ok := o.(obj)
		if !ok {
			return nil
		}
		o = mm[p]
	}
	return o
}

func str(o any, path ...string) string {
	s, _ := get(o, path...).(string)
	return s
}

func list(o any, path ...string) []any {
	l, _ := get(o, path...).([]any)
	return l
}

func num(o any, path ...string) (int, bool) {
	switch v := get(o, path...).(type) {
	case int:
		return v, true
	case float64:
		return int(v), true
	case string:
		n, err := strconv.Atoi(v)
		return n, err == nil
	}
	return 0, false
}

func boolean(o any, path ...string) (bool, bool) {
	b, ok := get(o, path...).(bool)
	return b, ok
}

func name(o obj) string { return str(o, "metadata", "name") }

func describe(o obj) string { return fmt.Sprintf("%s/%s", str(o, "kind"), name(o)) }

// --- what the manifest holds ---------------------------------------------------

func (m *Manifest) ofKind(kind string) []obj {
	var out []obj
	for _, o := range m.Objects {
		if str(o, "kind") == kind {
			out = append(out, o)
		}
	}
	return out
}

// configMaps returns the ConfigMaps holding rtproxy.yaml and the rule files
// (by the chart's component label).
func (m *Manifest) configMaps() (configs, rules []obj) {
	for _, cm := range m.ofKind("ConfigMap") {
		switch str(cm, "metadata", "labels", "app.kubernetes.io/component") {
		case "config":
			if data, _ := get(cm, "data").(obj); data != nil && data[ConfigKey] != nil {
				configs = append(configs, cm)
			}
		case "rules":
			rules = append(rules, cm)
		}
	}
	return configs, rules
}

// pod is a pod template found in a workload, with the proxy container in it.
type pod struct {
	owner     obj
	labels    obj
	spec      obj
	container obj
}

func (m *Manifest) pods() []pod {
	var out []pod
	for _, o := range m.Objects {
		var tmpl any
		switch str(o, "kind") {
		case "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job":
			tmpl = get(o, "spec", "template")
		case "Pod":
			tmpl = o
		default:
			continue
		}
		spec, _ := get(tmpl, "spec").(obj)
		for _, c := range list(spec, "containers") {
			if str(c, "name") == ContainerName {
				labels, _ := get(tmpl, "metadata", "labels").(obj)
				out = append(out, pod{owner: o, labels: labels, spec: spec, container: c.(obj)})
			}
		}
	}
	return out
}

// WriteRules writes every file of the rendered rules ConfigMap(s) into dir.
func (m *Manifest) WriteRules(dir string) (int, error) {
	_, rules := m.configMaps()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	n := 0
	for _, cm := range rules {
		data, _ := get(cm, "data").(obj)
		for file, content := range data {
			if file != filepath.Base(file) || strings.HasPrefix(file, ".") {
				return n, fmt.Errorf("%s: data key %q is not a plain file name", describe(cm), file)
			}
			s, ok := content.(string)
			if !ok {
				return n, fmt.Errorf("%s: data %q is not a string", describe(cm), file)
			}
			if err := os.WriteFile(filepath.Join(dir, file), []byte(s), 0o644); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// expected is what the rendered config says the pod must expose and mount.
type expected struct {
	cfg        *config.Config
	listenPort int
	adminPort  int
	ports      []int // listen, every broker port, admin; sorted
}

func portOf(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// Check returns every disagreement between the rendered config and the
// rendered workloads, Services and ServiceMonitors. wantPods is the number of
// pod templates expected to carry the proxy container.
func (m *Manifest) Check(wantPods int) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	configs, rules := m.configMaps()
	if len(configs) != 1 {
		bad("want exactly 1 ConfigMap with component=config and data %q, found %d", ConfigKey, len(configs))
		return problems
	}
	cfgMap := configs[0]
	pods := m.pods()
	if len(pods) != wantPods {
		bad("want %d pod template(s) with a %q container, found %d", wantPods, ContainerName, len(pods))
	}

	// The environment the proxy would see: the container's RTPROXY_*
	// variables, with Secret references standing in as placeholders.
	env := map[string]string{}
	for _, p := range pods {
		for _, e := range list(p.container, "env") {
			n := str(e, "name")
			if !strings.HasPrefix(n, config.EnvPrefix) {
				continue
			}
			if v, ok := get(e, "value").(string); ok {
				env[n] = v
			} else {
				env[n] = "placeholder-from-" + n
			}
		}
	}
	cfg := config.Default()
	raw := str(cfgMap, "data", ConfigKey)
	if err := cfg.Parse(describe(cfgMap)+" "+ConfigKey, []byte(raw)); err != nil {
		bad("the proxy's config loader refuses the rendered %s: %v", ConfigKey, err)
		return problems
	}
	if cfg.SASL.Password != "" {
		bad("sasl.password is written into ConfigMap %s; it belongs in a Secret (RTPROXY_SASL_PASSWORD from a secretKeyRef)", name(cfgMap))
	}
	if err := cfg.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		bad("environment of the rtproxy container: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		bad("the proxy's config validation refuses the rendered %s: %v", ConfigKey, err)
		return problems
	}
	exp := expected{cfg: cfg, listenPort: portOf(cfg.Listen), adminPort: portOf(cfg.AdminListen)}
	exp.ports = append(exp.ports, exp.listenPort, exp.adminPort)
	for p := cfg.BrokerPorts; p < cfg.BrokerPorts+cfg.BrokerPortCount; p++ {
		exp.ports = append(exp.ports, p)
	}
	sort.Ints(exp.ports)
	if h, _, _ := net.SplitHostPort(cfg.AdminListen); h != "" && h != "0.0.0.0" && h != "::" {
		bad("admin_listen %q binds %s only: the kubelet probes the pod IP, so /healthz and /readyz would never answer (want 0.0.0.0:%d)", cfg.AdminListen, h, exp.adminPort)
	}

	rulesCMName := ""
	if len(rules) == 1 {
		rulesCMName = name(rules[0])
	} else if len(rules) > 1 {
		bad("want at most 1 rules ConfigMap, found %d", len(rules))
	}
	for _, p := range pods {
		problems = append(problems, checkPod(p, exp, name(cfgMap), rulesCMName)...)
	}
	problems = append(problems, m.checkServices(pods, exp)...)
	return problems
}

// CheckReplicas returns a problem for every workload with the proxy
// container whose spec.replicas is not want. Several replicas with rules are
// normal since routes are shared through their consumer groups; the check
// proves that a rendering asked for N replicas runs N proxies (and that the
// chart no longer refuses them).
func (m *Manifest) CheckReplicas(want int) []string {
	var problems []string
	for _, p := range m.pods() {
		switch str(p.owner, "kind") {
		case "Deployment", "StatefulSet", "ReplicaSet":
		default:
			continue
		}
		got, ok := num(p.owner, "spec", "replicas")
		if !ok {
			got = 1 // the Kubernetes default
		}
		if got != want {
			problems = append(problems, fmt.Sprintf("%s: replicas %d, want %d", describe(p.owner), got, want))
		}
	}
	return problems
}

func checkPod(p pod, exp expected, configCM, rulesCM string) []string {
	var problems []string
	where := describe(p.owner) + " container " + ContainerName
	bad := func(format string, args ...any) {
		problems = append(problems, where+": "+fmt.Sprintf(format, args...))
	}
	c := p.container
	cfg := exp.cfg

	// The command line: the image's entrypoint is the binary.
	var args []string
	for _, a := range list(c, "args") {
		s, _ := a.(string)
		args = append(args, s)
	}
	configPath := ""
	if len(args) >= 3 && args[0] == "run" && args[1] == "--config" {
		configPath = args[2]
	} else {
		bad("args %q, want [run --config PATH]", args)
	}

	// Ports: exactly the listen port, the broker range and the admin port.
	var got []int
	names := map[string]int{}
	for _, cp := range list(c, "ports") {
		n, _ := num(cp, "containerPort")
		got = append(got, n)
		if pn := str(cp, "name"); pn != "" {
			if _, dup := names[pn]; dup {
				bad("port name %q used twice", pn)
			}
			names[pn] = n
		}
	}
	sort.Ints(got)
	if !slices.Equal(got, exp.ports) {
		bad("containerPorts %s, but the config listens on %s", ranges(got), ranges(exp.ports))
	}

	// Probes hit the admin listener on the right paths.
	for _, pr := range []struct{ field, path string }{{"livenessProbe", "/healthz"}, {"readinessProbe", "/readyz"}} {
		h := get(c, pr.field, "httpGet")
		if h == nil {
			bad("%s has no httpGet", pr.field)
			continue
		}
		if got := str(h, "path"); got != pr.path {
			bad("%s path %q, want %q", pr.field, got, pr.path)
		}
		port, ok := num(h, "port")
		if !ok {
			port, ok = names[str(h, "port")]
		}
		if !ok || port != exp.adminPort {
			bad("%s port %v is not the admin port %d (admin_listen %s)", pr.field, get(h, "port"), exp.adminPort, cfg.AdminListen)
		}
	}

	// Mounts: config file, rules directory (no subPath, or ConfigMap edits
	// never arrive), state directory (writable), TLS files.
	volumes := map[string]obj{}
	for _, v := range list(p.spec, "volumes") {
		if vo, ok := v.(obj); ok {
			volumes[str(vo, "name")] = vo
		}
	}
	type mount struct {
		path, subPath string
		readOnly      bool
		volume        obj
	}
	var mounts []mount
	for _, vm := range list(c, "volumeMounts") {
		ro, _ := boolean(vm, "readOnly")
		v, ok := volumes[str(vm, "name")]
		if !ok {
			bad("volumeMount %q has no volume of that name in the pod", str(vm, "name"))
			continue
		}
		mounts = append(mounts, mount{path: str(vm, "mountPath"), subPath: str(vm, "subPath"), readOnly: ro, volume: v})
	}
	find := func(path string) (mount, bool) {
		for _, mt := range mounts {
			if mt.path == path {
				return mt, true
			}
		}
		return mount{}, false
	}
	covering := func(file string) (mount, bool) {
		var best mount
		found := false
		for _, mt := range mounts {
			if mt.path == file || strings.HasPrefix(file, strings.TrimSuffix(mt.path, "/")+"/") {
				if !found || len(mt.path) > len(best.path) {
					best, found = mt, true
				}
			}
		}
		return best, found
	}

	if configPath != "" {
		mt, ok := find(configPath)
		switch {
		case !ok:
			dir, okDir := find(filepath.Dir(configPath))
			if !okDir || str(dir.volume, "configMap", "name") != configCM {
				bad("--config %s is not mounted from ConfigMap %s", configPath, configCM)
			}
		case str(mt.volume, "configMap", "name") != configCM:
			bad("--config %s is mounted from %v, want ConfigMap %s", configPath, mt.volume, configCM)
		case mt.subPath != ConfigKey:
			bad("--config %s mounts subPath %q, want %q", configPath, mt.subPath, ConfigKey)
		}
	}
	if mt, ok := find(cfg.RulesDir); !ok {
		bad("rules_dir %s is not a mount", cfg.RulesDir)
	} else {
		if mt.subPath != "" {
			bad("rules_dir %s is mounted with subPath %q: ConfigMap edits would never reach the hot reload", cfg.RulesDir, mt.subPath)
		}
		cmName := str(mt.volume, "configMap", "name")
		if cmName == "" {
			bad("rules_dir %s is not mounted from a ConfigMap", cfg.RulesDir)
		} else if rulesCM != "" && cmName != rulesCM {
			bad("rules_dir %s mounts ConfigMap %s, but the rendered rules are in %s", cfg.RulesDir, cmName, rulesCM)
		}
	}
	if mt, ok := find(cfg.StateDir); !ok {
		bad("state_dir %s is not a mount: with a read-only root filesystem the proxy cannot checkpoint", cfg.StateDir)
	} else if mt.readOnly || mt.subPath != "" {
		bad("state_dir %s must be a writable whole-volume mount", cfg.StateDir)
	} else if get(mt.volume, "emptyDir") == nil && get(mt.volume, "persistentVolumeClaim") == nil {
		bad("state_dir %s is neither an emptyDir nor a PersistentVolumeClaim", cfg.StateDir)
	}
	tlsFiles := map[string]string{
		"tls.client.cert_file":      cfg.TLS.Client.CertFile,
		"tls.client.key_file":       cfg.TLS.Client.KeyFile,
		"tls.client.client_ca_file": cfg.TLS.Client.ClientCAFile,
		"tls.upstream.ca_file":      cfg.TLS.Upstream.CAFile,
		"tls.upstream.cert_file":    cfg.TLS.Upstream.CertFile,
		"tls.upstream.key_file":     cfg.TLS.Upstream.KeyFile,
		// The schema registry's credentials and CA come from Secrets too.
		"schema_registry.basic_auth_file":   cfg.SchemaRegistry.BasicAuthFile,
		"schema_registry.bearer_token_file": cfg.SchemaRegistry.BearerTokenFile,
		"schema_registry.ca_file":           cfg.SchemaRegistry.CAFile,
	}
	for _, key := range slices.Sorted(maps.Keys(tlsFiles)) {
		f := tlsFiles[key]
		if f == "" {
			continue
		}
		if mt, ok := covering(f); !ok || get(mt.volume, "secret") == nil {
			bad("%s %s is not inside a mounted Secret", key, f)
		}
	}

	// SASL: the password never sits in the ConfigMap; it comes from a Secret.
	if cfg.SASL.Mechanism != "" {
		ok := false
		for _, e := range list(c, "env") {
			if str(e, "name") == config.EnvPrefix+"SASL_PASSWORD" && str(e, "valueFrom", "secretKeyRef", "name") != "" {
				ok = true
			}
		}
		if !ok {
			bad("sasl.mechanism %s but no RTPROXY_SASL_PASSWORD from a secretKeyRef", cfg.SASL.Mechanism)
		}
	}

	// Security and resources.
	sc := func(field string) any {
		if v := get(c, "securityContext", field); v != nil {
			return v
		}
		return get(p.spec, "securityContext", field)
	}
	if sc("runAsNonRoot") != true {
		bad("securityContext.runAsNonRoot is not true")
	}
	if get(c, "securityContext", "allowPrivilegeEscalation") != false {
		bad("securityContext.allowPrivilegeEscalation is not false")
	}
	if get(c, "securityContext", "readOnlyRootFilesystem") != true {
		bad("securityContext.readOnlyRootFilesystem is not true")
	}
	for _, r := range []string{"requests", "limits"} {
		if l, _ := get(c, "resources", r).(obj); len(l) == 0 {
			bad("resources.%s is empty", r)
		}
	}
	return problems
}

func (m *Manifest) checkServices(pods []pod, exp expected) []string {
	var problems []string
	services := map[string]obj{}
	for _, p := range pods {
		h, _, _ := net.SplitHostPort(exp.cfg.Listen)
		loopback := h == "127.0.0.1" || h == "localhost" || h == "::1"
		if loopback && exp.cfg.AdvertiseHost != "127.0.0.1" && exp.cfg.AdvertiseHost != "localhost" {
			problems = append(problems, fmt.Sprintf("%s: listens on loopback %s but advertises %q; clients outside the pod could not reach it and clients inside would leave the pod", describe(p.owner), exp.cfg.Listen, exp.cfg.AdvertiseHost))
		}
		if loopback {
			// A sidecar: the Services selecting this pod are the
			// application's, and the proxy is reachable only in the pod.
			continue
		}
		var selecting []obj
		for _, svc := range m.ofKind("Service") {
			sel, _ := get(svc, "spec", "selector").(obj)
			if len(sel) == 0 {
				continue
			}
			match := true
			for k, v := range sel {
				if p.labels[k] != v {
					match = false
				}
			}
			if match {
				selecting = append(selecting, svc)
				services[name(svc)] = svc
			}
		}
		if len(selecting) == 0 {
			problems = append(problems, fmt.Sprintf("%s: listens on %s but no Service selects its pods", describe(p.owner), exp.cfg.Listen))
		}
		containerPorts := map[string]int{}
		for _, cp := range list(p.container, "ports") {
			n, _ := num(cp, "containerPort")
			containerPorts[str(cp, "name")] = n
		}
		for _, svc := range selecting {
			where := describe(svc)
			var got []int
			for _, sp := range list(svc, "spec", "ports") {
				port, _ := num(sp, "port")
				got = append(got, port)
				target, ok := num(sp, "targetPort")
				if !ok {
					tn := str(sp, "targetPort")
					if tn == "" {
						target, ok = port, true
					} else {
						target, ok = containerPorts[tn]
					}
				}
				if !ok {
					problems = append(problems, fmt.Sprintf("%s: port %d targets %v, which the rtproxy container does not name", where, port, get(sp, "targetPort")))
				} else if target != port {
					// Clients dial the advertised broker ports; the Service
					// must carry them unchanged to the same port in the pod.
					problems = append(problems, fmt.Sprintf("%s: port %d goes to container port %d; every port must map to itself", where, port, target))
				}
			}
			sort.Ints(got)
			if !slices.Equal(got, exp.ports) {
				problems = append(problems, fmt.Sprintf("%s: ports %s, but the config listens on %s", where, ranges(got), ranges(exp.ports)))
			}
			if strings.HasSuffix(exp.cfg.AdvertiseHost, ".svc") || strings.HasSuffix(exp.cfg.AdvertiseHost, ".svc.cluster.local") {
				if !strings.HasPrefix(exp.cfg.AdvertiseHost, name(svc)+".") {
					problems = append(problems, fmt.Sprintf("%s: advertise_host %q names another Service", where, exp.cfg.AdvertiseHost))
				}
			}
		}
	}
	for _, sm := range m.ofKind("ServiceMonitor") {
		for _, ep := range list(sm, "spec", "endpoints") {
			pn := str(ep, "port")
			found := false
			for _, svc := range services {
				for _, sp := range list(svc, "spec", "ports") {
					if str(sp, "name") == pn {
						p, _ := num(sp, "port")
						found = p == exp.adminPort
					}
				}
			}
			if !found {
				problems = append(problems, fmt.Sprintf("%s: endpoint port %q is not the admin port %d of a Service in front of rtproxy", describe(sm), pn, exp.adminPort))
			}
			if path := str(ep, "path"); path != "" && path != "/metrics" {
				problems = append(problems, fmt.Sprintf("%s: endpoint path %q, want /metrics", describe(sm), path))
			}
		}
	}
	return problems
}

// ranges prints a sorted port list compactly: 9092-9095,9644.
func ranges(ps []int) string {
	if len(ps) == 0 {
		return "(none)"
	}
	var parts []string
	start, prev := ps[0], ps[0]
	flush := func() {
		if start == prev {
			parts = append(parts, strconv.Itoa(start))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", start, prev))
		}
	}
	for _, p := range ps[1:] {
		if p == prev+1 {
			prev = p
			continue
		}
		flush()
		start, prev = p, p
	}
	flush()
	return strings.Join(parts, ",")
}
