package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/state"
)

const stateUsage = `usage: rtproxy state list [--config FILE] [--state-dir DIR]
       rtproxy state drop ROUTE [--config FILE] [--state-dir DIR]

The proxy keeps a route's state when its rule file is deleted, so that
restoring the file resumes where it stopped. "drop" deletes it for good.
Both work on a stopped proxy: a running one holds the state directory.
`

// cmdState inspects and drops pipeline state offline.
func cmdState(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "list" && args[0] != "drop") {
		fmt.Fprint(stderr, stateUsage)
		return 2
	}
	verb := args[0]
	fs := flag.NewFlagSet("rtproxy state "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := fs.String("config", "", "YAML config file (also RTPROXY_CONFIG)")
	stateDir := fs.String("state-dir", "", "state directory (default from config, RTPROXY_STATE_DIR, or ./state)")
	// The route name may come before or after the flags.
	var route string
	rest := args[1:]
	if verb == "drop" && len(rest) > 0 && len(rest[0]) > 0 && rest[0][0] != '-' {
		route, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if verb == "drop" && route == "" && fs.NArg() == 1 {
		route = fs.Arg(0)
	} else if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rtproxy state %s: unexpected argument %q\n%s", verb, fs.Arg(0), stateUsage)
		return 2
	}
	if verb == "drop" && route == "" {
		fmt.Fprintf(stderr, "rtproxy state drop: name the route\n%s", stateUsage)
		return 2
	}
	flags := map[string]string{}
	if *stateDir != "" {
		flags["state_dir"] = *stateDir
	}
	file := *configFile
	if file == "" {
		file = os.Getenv("RTPROXY_CONFIG")
	}
	cfg, err := config.Resolve(file, os.LookupEnv, flags)
	if err != nil {
		fmt.Fprintf(stderr, "rtproxy state: %v\n", err)
		return 2
	}
	dir := filepath.Join(cfg.StateDir, "pipelines")
	if _, err := os.Stat(dir); err != nil {
		fmt.Fprintf(stderr, "rtproxy state: no pipeline state in %s (%v)\n", cfg.StateDir, errors.Unwrap(err))
		return 1
	}
	db, err := state.Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK) {
			fmt.Fprintf(stderr, "rtproxy state: %s is in use, probably by a running rtproxy; stop it first\n", dir)
		} else {
			fmt.Fprintf(stderr, "rtproxy state: %v\n", err)
		}
		return 1
	}
	defer db.Close()
	routes, err := db.Routes()
	if err != nil {
		fmt.Fprintf(stderr, "rtproxy state: %v\n", err)
		return 1
	}

	if verb == "list" {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ROUTE\tLAST CHECKPOINT\tSEQ\tKEYS\tBYTES\tSTEPS")
		for _, r := range routes {
			last := "-"
			if !r.LastCheckpoint.IsZero() {
				last = r.LastCheckpoint.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\n", r.Route, last, r.Seq, r.Keys, r.Bytes, len(r.Steps))
		}
		tw.Flush()
		return 0
	}

	if !slices.ContainsFunc(routes, func(r state.RouteInfo) bool { return r.Route == route }) {
		fmt.Fprintf(stderr, "rtproxy state drop: no state for route %q in %s\n", route, dir)
		return 1
	}
	if err := db.DropRoute(route); err != nil {
		fmt.Fprintf(stderr, "rtproxy state drop: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "dropped the state of route %s\n", route)
	return 0
}
