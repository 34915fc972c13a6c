package pipeline

import (
	"strings"
	"testing"

	"github.com/rtproxy/rtproxy/rules"
)

// TestDefinitionRequiresItsValues: the pipeline takes every default from
// rules and keeps none of its own; a route that lacks one (built by hand,
// not loaded) is refused with each missing value named, never run with a
// guess.
func TestDefinitionRequiresItsValues(t *testing.T) {
	good := newRouteDef("r", "h", "in", "out", filterStep(t, 0, "true"))
	if err := checkDefinition(good); err != nil {
		t.Fatalf("a complete route is refused: %v", err)
	}
	bad := *good
	bad.Source.IdleTimeout = 0
	bad.Source.Format = ""
	bad.CheckpointInterval = 0
	bad.Steps = []rules.StepSpec{{Index: 0, Kind: "filter"}}
	err := checkDefinition(&bad)
	if err == nil {
		t.Fatal("a route without idle_timeout, format and checkpoint_interval is accepted")
	}
	for _, want := range []string{"source.idle_timeout", "source.format", "checkpoint_interval", "step 0 (filter) cannot be built"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}
