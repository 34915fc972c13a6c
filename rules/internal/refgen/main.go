// Command refgen rewrites the generated step reference of a document
// (docs/RULES.md) from the step specs: `go generate ./rules`.
package main

import (
	"fmt"
	"os"

	"github.com/rtproxy/rtproxy/rules"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: refgen DOC.md")
		os.Exit(2)
	}
	doc, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := rules.ReplaceReference(string(doc), rules.StepReference())
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	if err := os.WriteFile(os.Args[1], []byte(out), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
