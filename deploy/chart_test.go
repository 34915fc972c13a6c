package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/testkit"
)

// helmBinary finds the helm that deploy/scripts/helm-check.sh uses: $HELM,
// else ./bin/helm at the module root (built there once by ensure_helm in
// deploy/scripts/lib.sh). Building helm takes minutes, so a test does not:
// without it the chart tests skip, and `make test` still renders the same
// values in helm-check.sh.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	bin := filepath.Join(testkit.ModuleRoot(t), "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no helm at %s and $HELM unset: run deploy/scripts/helm-check.sh once (it builds helm into bin/ and renders the same values)", bin)
	}
	return bin
}

// helmTemplate runs `helm template` and decodes the objects it renders.
func helmTemplate(t *testing.T, helm string, args ...string) ([]map[string]any, error) {
	t.Helper()
	cmd := exec.Command(helm, append([]string{"template", "rtp"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, errors.New(strings.TrimSpace(stderr.String()))
	}
	var objs []map[string]any
	dec := yaml.NewDecoder(&stdout)
	for {
		var o map[string]any
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("helm template output is not YAML: %v", err)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
	return objs, nil
}

func field(o any, path ...string) any {
	for _, p := range path {
		m, ok := o.(map[string]any)
		if !ok {
			return nil
		}
		o = m[p]
	}
	return o
}

// checkSharedRoutes asserts what several instances sharing their routes need
// from a rendering: one Deployment with `replicas` pods whose pod template
// holds the rtproxy container, no Recreate strategy (with the state on an
// emptyDir a rollout overlaps old and new pods, and the route's consumer
// group hands partitions over), state on an emptyDir, and the rule files in
// the rules ConfigMap.
func checkSharedRoutes(t *testing.T, objs []map[string]any, replicas int, ruleFile string) {
	t.Helper()
	var deployments []map[string]any
	rules := map[string]any{}
	for _, o := range objs {
		switch field(o, "kind") {
		case "Deployment":
			deployments = append(deployments, o)
		case "ConfigMap":
			if field(o, "metadata", "labels", "app.kubernetes.io/component") == "rules" {
				for k, v := range field(o, "data").(map[string]any) {
					rules[k] = v
				}
			}
		}
	}
	if len(deployments) != 1 {
		t.Fatalf("rendered %d Deployments, want 1", len(deployments))
	}
	d := deployments[0]
	if got := field(d, "spec", "replicas"); got != replicas {
		t.Errorf("Deployment replicas = %v, want %d", got, replicas)
	}
	if s := field(d, "spec", "strategy", "type"); s == "Recreate" {
		t.Errorf("Deployment strategy is Recreate: with shared routes and emptyDir state, pods may overlap during a rollout")
	}
	hasProxy := false
	for _, c := range field(d, "spec", "template", "spec", "containers").([]any) {
		hasProxy = hasProxy || field(c, "name") == "rtproxy"
	}
	if !hasProxy {
		t.Errorf("the Deployment's pods have no rtproxy container")
	}
	for _, v := range field(d, "spec", "template", "spec", "volumes").([]any) {
		if field(v, "name") == "rtproxy-state" && field(v, "emptyDir") == nil {
			t.Errorf("state volume is %v, want an emptyDir (the default)", v)
		}
	}
	if _, ok := rules[ruleFile]; !ok {
		t.Errorf("the rules ConfigMap holds %v, want %s", rules, ruleFile)
	}
}

// TestChartRendersReplicasWithRules: routes are shared by every instance
// that runs them (docs/ARCHITECTURE.md), so the chart renders three
// replicas with rules, in standalone mode and as the sidecar of a
// three-replica app. (The chart refused both before shared routes.)
func TestChartRendersReplicasWithRules(t *testing.T) {
	helm := helmBinary(t)
	chart := filepath.Join("helm", "rtproxy")

	t.Run("standalone", func(t *testing.T) {
		objs, err := helmTemplate(t, helm, chart,
			"--set", "replicaCount=3",
			"--set", "proxy.upstream={kafka-0.kafka.svc:9092}",
			"--set-file", `rules.files.dashboard-route\.yaml=testdata/dashboard-route.yaml`)
		if err != nil {
			t.Fatalf("helm template refused replicaCount=3 with rules: %v", err)
		}
		checkSharedRoutes(t, objs, 3, "dashboard-route.yaml")
	})

	t.Run("sidecar beside a three-replica app", func(t *testing.T) {
		// `helm dependency build` writes charts/ and Chart.lock: work on a copy.
		dir := t.TempDir()
		if out, err := exec.Command("cp", "-r", "helm", dir).CombinedOutput(); err != nil {
			t.Fatalf("copy the charts: %v\n%s", err, out)
		}
		app := filepath.Join(dir, "helm", "examples", "app")
		if out, err := exec.Command(helm, "dependency", "build", app).CombinedOutput(); err != nil {
			t.Fatalf("helm dependency build: %v\n%s", err, out)
		}
		objs, err := helmTemplate(t, helm, app, "--set", "replicaCount=3")
		if err != nil {
			t.Fatalf("helm template refused the example app with replicaCount=3 and rules: %v", err)
		}
		checkSharedRoutes(t, objs, 3, "orders-large.yaml")
	})

	// One claim cannot hold the state of several pods (a ReadWriteOnce
	// volume, and pebble locks its directory), and with shared routes it
	// need not: the state comes back from the changelog topics.
	t.Run("persistent volume with replicas is refused", func(t *testing.T) {
		_, err := helmTemplate(t, helm, chart,
			"--set", "replicaCount=2",
			"--set", "state.type=persistentVolumeClaim",
			"--set-file", `rules.files.dashboard-route\.yaml=testdata/dashboard-route.yaml`)
		if err == nil || !strings.Contains(err.Error(), "state.type persistentVolumeClaim") {
			t.Fatalf("helm template with replicaCount=2 and a state PVC: err = %v, want a refusal naming state.type persistentVolumeClaim", err)
		}
	})
}
