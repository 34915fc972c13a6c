package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/state"
	"github.com/twmb/franz-go/pkg/kgo"
)

const stateUsage = `usage: rtproxy state list [--config FILE] [--state-dir DIR]
       rtproxy state drop ROUTE [--config FILE] [--state-dir DIR]

The proxy keeps a route's state when its rule file is deleted, so that
restoring the file resumes where it stopped. "drop" deletes it for good:
in the state directory, and in Kafka the route's consumer group and its
changelog and repartition topics (refused while another instance still
runs the route). Both work on a stopped proxy: a running one holds the
state directory.
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
	// What the route keeps in Kafka (its group's offsets, its changelog and
	// repartition topics) goes first: a restored rule file must start from
	// source.start, not from the group's offsets.
	ks, ok, err := pipeline.ReadKafkaState(db.GetDurable, route)
	if err != nil {
		fmt.Fprintf(stderr, "rtproxy state drop: %v\n", err)
		return 1
	}
	if ok {
		if err := resetKafkaState(cfg, ks); err != nil {
			fmt.Fprintf(stderr, "rtproxy state drop: route %s: %v; nothing was dropped\n", route, err)
			return 1
		}
		fmt.Fprintf(stdout, "deleted consumer group %s and topics %s\n", ks.Group, strings.Join(ks.Topics, ", "))
	}
	if err := db.DropRoute(route); err != nil {
		fmt.Fprintf(stderr, "rtproxy state drop: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "dropped the state of route %s\n", route)
	return 0
}

// resetKafkaState deletes a route's group and internal topics on the
// configured upstream, or on the embedded cluster kept in the state
// directory (started for the purpose, as the proxy is stopped).
func resetKafkaState(cfg *config.Config, ks pipeline.KafkaState) error {
	seeds := cfg.Upstream
	var opts []kgo.Opt
	if cfg.Embedded() {
		e, err := startEmbedded(cfg.StateDir, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		defer e.Close()
		seeds = e.addrs
	} else {
		utls, err := upstreamTLS(cfg.TLS.Upstream)
		if err != nil {
			return err
		}
		if opts, err = pipelineClientOpts(cfg, utls); err != nil {
			return err
		}
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return pipeline.ResetKafkaState(ctx, cl, ks)
}
