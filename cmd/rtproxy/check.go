package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rtproxy/rtproxy/rules"
)

// cmdCheck lints rule files, route and guard files alike, the way the
// running proxy loads them.
func cmdCheck(args []string, stdout, stderr io.Writer) int {
	const usage = "usage: rtproxy check [--tables-dir DIR] PATH...   (rule files or directories)"
	var o rules.Options
	var paths []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--tables-dir" || a == "-tables-dir":
			if i+1 >= len(args) {
				fmt.Fprintf(stderr, "rtproxy check: %s needs a directory\n%s\n", a, usage)
				return 2
			}
			i++
			o.TablesDir = args[i]
		case strings.HasPrefix(a, "--tables-dir="):
			o.TablesDir = strings.TrimPrefix(a, "--tables-dir=")
		case len(a) > 1 && a[0] == '-':
			fmt.Fprintf(stderr, "rtproxy check: unknown flag %s\n%s\n", a, usage)
			return 2
		default:
			paths = append(paths, a)
		}
	}
	if len(paths) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if o.TablesDir == "" {
		o.TablesDir = os.Getenv("RTPROXY_TABLES_DIR")
	}
	return checkRules(paths, o, stdout, stderr)
}
