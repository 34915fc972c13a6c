package rules

import (
	"fmt"
	"strings"

	"github.com/rtproxy/rtproxy/operators"
)

//go:generate go run ./internal/refgen ../docs/RULES.md

// The reference of steps in docs/RULES.md is generated from the step
// Specs (operators/spec.go) between these two lines; `go generate ./rules`
// rewrites it, and TestStepReferenceUpToDate fails when it is stale.
const (
	ReferenceBegin = "<!-- BEGIN generated from the step specs by `go generate ./rules`; edit operators/<step>.go, not this -->"
	ReferenceEnd   = "<!-- END generated -->"
)

// StepReference is the generated reference of every step kind: what it
// does and what state it keeps, its keys, and its example.
func StepReference() string {
	var b strings.Builder
	specs := operators.Specs()
	b.WriteString("| step | what it does | state |\n|---|---|---|\n")
	for _, s := range specs {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", specName(s), cell(s.Summary), traits(s))
	}
	b.WriteString("\n| step | key | type | required | default | what it is |\n|---|---|---|---|---|---|\n")
	for _, s := range specs {
		if s.Body != nil {
			fmt.Fprintf(&b, "| %s | (the step's value) | %s | yes | — | %s |\n", specName(s), typeText(s.Body), cell(s.Body.Doc))
			continue
		}
		for _, k := range s.Keys {
			req := "no"
			if k.Required {
				req = "yes"
			}
			fmt.Fprintf(&b, "| %s | `%s` | %s | %s | %s | %s |\n", specName(s), k.Name, typeText(&k), req, defaultText(&k), cell(k.Doc))
		}
	}
	for _, s := range specs {
		fmt.Fprintf(&b, "\n%s, for example:\n\n<!-- rule-file: step-%s.yaml -->\n```yaml\n%s```\n", specName(s), s.ID(), s.Example)
	}
	return b.String()
}

// specName is how the docs name a spec: its kind, and the key that
// selects its form ("`join` with `stream`").
func specName(s *operators.Spec) string {
	if s.Form == "" {
		return "`" + s.Kind + "`"
	}
	return "`" + s.Kind + "` with `" + s.Form + "`"
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func typeText(k *operators.Key) string {
	if k.Type == operators.TypeEnum {
		return "`" + strings.Join(k.Choices, "` \\| `") + "`"
	}
	return k.Type.String()
}

func defaultText(k *operators.Key) string {
	switch {
	case k.Default != "":
		return "`" + k.Default + "`"
	case k.DefaultFrom != "":
		return "the `" + k.DefaultFrom + "`"
	case k.Absent != "":
		return cell(k.Absent)
	}
	return "—"
}

// traits says what state a step keeps, from the traits its example's
// Compile declares: the pipeline decides by the same traits.
func traits(s *operators.Spec) string {
	res := loadBytes(s.ID()+".yaml", []byte(s.Example), Options{})
	if res.route == nil {
		return "?"
	}
	for _, st := range res.route.Steps {
		if st.Kind != s.Kind {
			continue
		}
		var t []string
		if st.Traits.Keyed {
			k := "keyed"
			if s.KeyedBy != "" {
				k += " by `" + s.KeyedBy + "` (a repartition topic, a changelog topic)"
			}
			t = append(t, k)
		}
		if st.Traits.Timed {
			t = append(t, "follows the watermark")
		}
		if st.Traits.Stateful {
			t = append(t, "snapshots")
		}
		if len(t) == 0 {
			return "none"
		}
		return strings.Join(t, "; ")
	}
	return "?"
}

// ReplaceReference returns doc with the text between ReferenceBegin and
// ReferenceEnd replaced by ref.
func ReplaceReference(doc, ref string) (string, error) {
	i := strings.Index(doc, ReferenceBegin)
	j := strings.Index(doc, ReferenceEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("the document has no %q ... %q section", ReferenceBegin, ReferenceEnd)
	}
	return doc[:i+len(ReferenceBegin)] + "\n" + ref + doc[j:], nil
}
