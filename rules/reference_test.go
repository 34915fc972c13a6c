package rules

import (
	"os"
	"testing"
)

// TestStepReferenceUpToDate fails when docs/RULES.md's generated step
// reference is not what the step specs generate: run `go generate ./rules`.
func TestStepReferenceUpToDate(t *testing.T) {
	doc, err := os.ReadFile("../docs/RULES.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := ReplaceReference(string(doc), StepReference())
	if err != nil {
		t.Fatal(err)
	}
	if want != string(doc) {
		t.Error("docs/RULES.md's step reference is stale: run `go generate ./rules`")
	}
}
