package main

import (
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/rtproxy/rtproxy/cmd/rtproxy/internal/ruletest"
)

// cmdTest is `rtproxy test`: the tests beside rule files, run through the
// same pipeline code as `rtproxy run`, with no broker.
func cmdTest(args []string, stdout, stderr io.Writer) int {
	const usage = "usage: rtproxy test [-v] [--run REGEXP] [--format text|json] [--config FILE] [--tables-dir DIR] PATH...   (test files, rule files or directories)"
	var o ruletest.Options
	var paths []string
	configFile := ""
	value := func(i *int, a string) (string, bool) {
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "-") {
			return v, true
		}
		if *i+1 >= len(args) {
			fmt.Fprintf(stderr, "rtproxy test: %s needs a value\n%s\n", a, usage)
			return "", false
		}
		*i++
		return args[*i], true
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		flag, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		switch {
		case a == "-v" || a == "--v" || a == "-test.v":
			o.Verbose = true
		case flag == "-run" || flag == "run":
			v, ok := value(&i, a)
			if !ok {
				return 2
			}
			re, err := regexp.Compile(v)
			if err != nil {
				fmt.Fprintf(stderr, "rtproxy test: --run %q: %v\n", v, err)
				return 2
			}
			o.Run = re
		case flag == "-format" || flag == "format":
			v, ok := value(&i, a)
			if !ok {
				return 2
			}
			switch v {
			case "text":
			case "json":
				o.JSON = true
			default:
				fmt.Fprintf(stderr, "rtproxy test: --format is text or json, not %q\n", v)
				return 2
			}
		case a == "-json" || a == "--json":
			o.JSON = true
		case flag == "-tables-dir" || flag == "tables-dir":
			v, ok := value(&i, a)
			if !ok {
				return 2
			}
			o.Rules.TablesDir = v
		case flag == "-config" || flag == "config":
			v, ok := value(&i, a)
			if !ok {
				return 2
			}
			configFile = v
		case len(a) > 1 && a[0] == '-':
			fmt.Fprintf(stderr, "rtproxy test: unknown flag %s\n%s\n", a, usage)
			return 2
		default:
			paths = append(paths, a)
		}
	}
	if len(paths) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	tablesDir := o.Rules.TablesDir
	ro, err := rulesOptionsFrom(configFile)
	if err != nil {
		fmt.Fprintf(stderr, "rtproxy test: %v\n", err)
		return 2
	}
	o.Rules = ro
	if tablesDir != "" {
		o.Rules.TablesDir = tablesDir
	}
	return ruletest.Main(stdout, paths, o)
}
