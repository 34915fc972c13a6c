package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/rules"
)

// cmdCheck lints rule files, route and guard files alike, the way the
// running proxy loads them.
func cmdCheck(args []string, stdout, stderr io.Writer) int {
	const usage = "usage: rtproxy check [--config FILE] [--tables-dir DIR] PATH...   (rule files or directories)"
	var o rules.Options
	var paths []string
	configFile := ""
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
		case a == "--config" || a == "-config":
			if i+1 >= len(args) {
				fmt.Fprintf(stderr, "rtproxy check: %s needs a file\n%s\n", a, usage)
				return 2
			}
			i++
			configFile = args[i]
		case strings.HasPrefix(a, "--config="):
			configFile = strings.TrimPrefix(a, "--config=")
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
	tablesDir := o.TablesDir
	o, err := rulesOptionsFrom(configFile)
	if err != nil {
		fmt.Fprintf(stderr, "rtproxy check: %v\n", err)
		return 2
	}
	if tablesDir != "" {
		o.TablesDir = tablesDir
	}
	return checkRules(paths, o, stdout, stderr)
}

// rulesOptionsFrom is the rules.Options of the proxy whose config is file
// (empty: RTPROXY_CONFIG, else defaults), with the RTPROXY_* environment on
// top: check and test judge rule files as that proxy would, with its
// allow-list (rules.allow), its schema_registry.url and its tables_dir.
func rulesOptionsFrom(file string) (rules.Options, error) {
	if file == "" {
		file = os.Getenv("RTPROXY_CONFIG")
	}
	cfg, err := config.Resolve(file, os.LookupEnv, nil)
	if err != nil {
		return rules.Options{}, fmt.Errorf("config: %w", err)
	}
	applyLimits(cfg)
	return rulesOptions(cfg), nil
}
