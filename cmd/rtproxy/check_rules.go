package main

import (
	"io"

	"github.com/rtproxy/rtproxy/rules"
)

// checkRules is the adapter to the rules package's linter: the same loader
// and analyzer the running proxy uses. It prints "ok FILE" for a good route
// file, "ok FILE (guard NAME: topic TOPIC, N checks)" for a good guard
// file, and each error on its own line. Exit 1 when anything is wrong.
func checkRules(paths []string, o rules.Options, stdout, _ io.Writer) int {
	if rules.CheckPathsWith(stdout, paths, o) {
		return 0
	}
	return 1
}
