package main

import (
	"fmt"
	"io"
)

// cmdCheck lints rule files the way the running proxy loads them.
func cmdCheck(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: rtproxy check PATH...   (rule files or directories)")
		return 2
	}
	for _, a := range args {
		if len(a) > 1 && a[0] == '-' {
			fmt.Fprintf(stderr, "rtproxy check: unknown flag %s\nusage: rtproxy check PATH...\n", a)
			return 2
		}
	}
	return checkRules(args, stdout, stderr)
}
