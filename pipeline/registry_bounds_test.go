package pipeline

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/rules"
)

// TestRuleFileRegistryKeepsTheProxysBounds: a rule file's own
// schema_registry takes its URL and credentials from the rule file, and
// the bounds and their counters from the proxy: a rule file cannot raise
// them.
func TestRuleFileRegistryKeepsTheProxysBounds(t *testing.T) {
	met, err := serde.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	proxy := serde.Config{URL: "http://proxy-registry:8081", Limits: serde.Limits{MaxResponseBytes: 1 << 20, MaxSchemaBytes: 1 << 16, MaxSchemaDepth: 8, MaxReferences: 3}, Metrics: met}
	d := &rules.Route{SchemaRegistry: &rules.SchemaRegistry{URL: "http://own-registry:8081"}}
	got := registryConfig(proxy, d)
	if got.URL != "http://own-registry:8081" || got.Limits != proxy.Limits || got.Metrics != met {
		t.Errorf("rule file's registry config: %+v", got)
	}
}
