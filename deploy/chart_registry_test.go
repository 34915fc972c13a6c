package deploy

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rtproxy/rtproxy/config"
)

// renderedConfig is the rtproxy.yaml of a rendering, loaded by the proxy's
// own config code, and the rtproxy container and pod volumes.
func renderedConfig(t *testing.T, objs []map[string]any) (*config.Config, map[string]any, []any) {
	t.Helper()
	var cfg *config.Config
	var container map[string]any
	var volumes []any
	for _, o := range objs {
		switch o["kind"] {
		case "ConfigMap":
			if s, ok := field(o, "data", "rtproxy.yaml").(string); ok {
				cfg = config.Default()
				if err := cfg.Parse("rtproxy.yaml", []byte(s)); err != nil {
					t.Fatalf("the rendered rtproxy.yaml does not load: %v\n%s", err, s)
				}
				if err := cfg.Validate(); err != nil {
					t.Fatalf("the rendered rtproxy.yaml is not valid: %v\n%s", err, s)
				}
			}
		case "Deployment":
			for _, c := range field(o, "spec", "template", "spec", "containers").([]any) {
				if field(c, "name") == "rtproxy" {
					container = c.(map[string]any)
				}
			}
			volumes, _ = field(o, "spec", "template", "spec", "volumes").([]any)
		}
	}
	if cfg == nil || container == nil {
		t.Fatal("no rtproxy.yaml ConfigMap or no rtproxy container rendered")
	}
	return cfg, container, volumes
}

// secretFile says which Secret and key the file at path comes from, through
// the container's mounts and the pod's volumes ("" when none).
func secretFile(container map[string]any, volumes []any, path string) (secret, key string) {
	for _, m := range field(container, "volumeMounts").([]any) {
		dir, _ := field(m, "mountPath").(string)
		if !strings.HasPrefix(path, dir+"/") {
			continue
		}
		for _, v := range volumes {
			if field(v, "name") != field(m, "name") {
				continue
			}
			name, _ := field(v, "secret", "secretName").(string)
			rel := strings.TrimPrefix(path, dir+"/")
			items, _ := field(v, "secret", "items").([]any)
			for _, it := range items {
				if field(it, "path") == rel {
					return name, field(it, "key").(string)
				}
			}
			if len(items) == 0 {
				return name, rel
			}
		}
	}
	return "", ""
}

// TestChartSchemaRegistry: the chart's schemaRegistry values reach
// rtproxy.yaml's schema_registry, with the credentials and the CA read from
// files of mounted Secrets (never inline), and loads with the proxy's own
// config code; with no url nothing is rendered.
func TestChartSchemaRegistry(t *testing.T) {
	helm := helmBinary(t)
	chart := filepath.Join("helm", "rtproxy")

	objs, err := helmTemplate(t, helm, chart,
		"--set", "proxy.upstream={kafka-0.kafka.svc:9092}",
		"--set", "schemaRegistry.url=https://registry.example:8081",
		"--set", "schemaRegistry.timeout=4s",
		"--set", "schemaRegistry.auth.type=bearer",
		"--set", "schemaRegistry.auth.secretName=reg-token",
		"--set", "schemaRegistry.caSecretName=reg-ca")
	if err != nil {
		t.Fatal(err)
	}
	cfg, c, vols := renderedConfig(t, objs)
	sr := cfg.SchemaRegistry
	if sr.URL != "https://registry.example:8081" || sr.Timeout != 4*time.Second || sr.BasicAuthFile != "" || sr.BasicAuthEnv != "" || sr.BearerTokenEnv != "" {
		t.Fatalf("schema_registry = %+v", sr)
	}
	if s, k := secretFile(c, vols, sr.BearerTokenFile); s != "reg-token" || k != "token" {
		t.Errorf("bearer_token_file %q comes from Secret %q key %q, want reg-token/token", sr.BearerTokenFile, s, k)
	}
	if s, k := secretFile(c, vols, sr.CAFile); s != "reg-ca" || k != "ca.crt" {
		t.Errorf("ca_file %q comes from Secret %q key %q, want reg-ca/ca.crt", sr.CAFile, s, k)
	}

	objs, err = helmTemplate(t, helm, chart,
		"--set", "schemaRegistry.url=http://registry:8081",
		"--set", "schemaRegistry.auth.type=basic",
		"--set", "schemaRegistry.auth.secretName=reg-basic",
		"--set", "schemaRegistry.auth.secretKey=user-pass")
	if err != nil {
		t.Fatal(err)
	}
	cfg, c, vols = renderedConfig(t, objs)
	sr = cfg.SchemaRegistry
	if sr.URL != "http://registry:8081" || sr.BearerTokenFile != "" || sr.CAFile != "" || sr.Timeout != config.Default().SchemaRegistry.Timeout {
		t.Fatalf("schema_registry = %+v", sr)
	}
	if s, k := secretFile(c, vols, sr.BasicAuthFile); s != "reg-basic" || k != "user-pass" {
		t.Errorf("basic_auth_file %q comes from Secret %q key %q, want reg-basic/user-pass", sr.BasicAuthFile, s, k)
	}

	objs, err = helmTemplate(t, helm, chart)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, _, _ = renderedConfig(t, objs); cfg.SchemaRegistry != config.Default().SchemaRegistry {
		t.Errorf("default values render schema_registry %+v", cfg.SchemaRegistry)
	}

	if _, err := helmTemplate(t, helm, chart, "--set", "schemaRegistry.url=http://r:1", "--set", "schemaRegistry.auth.type=basic"); err == nil ||
		!strings.Contains(err.Error(), "schemaRegistry.auth.type basic needs schemaRegistry.auth.secretName") {
		t.Errorf("basic auth without a Secret: %v", err)
	}
}
