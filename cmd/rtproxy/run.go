package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/protocol"
)

// runFlags maps each `run` flag (a contract: scripts drive the binary through
// these names) to its config key.
var runFlags = []struct{ flag, key, help string }{
	{"listen", "listen", "bootstrap address clients dial (default 127.0.0.1:9092)"},
	{"advertise-host", "advertise_host", "host advertised to clients for the per-broker listeners (default 127.0.0.1)"},
	{"broker-ports", "broker_ports", "first port of the per-broker listener range (default 9093)"},
	{"upstream", "upstream", "seed brokers HOST:PORT[,HOST:PORT...]; empty runs an embedded development cluster"},
	{"rules-dir", "rules_dir", "directory of rule files, one route per file (default ./rules)"},
	{"state-dir", "state_dir", "directory for pipeline state and checkpoints (default ./state)"},
	{"admin-listen", "admin_listen", "address of /metrics, /healthz, /readyz, /routes (default 127.0.0.1:9644)"},
	{"log-level", "log_level", "debug, info, warn or error (default info)"},
	{"pprof", "pprof", "serve Go profiles under /debug/pprof/ on admin_listen (--pprof alone means true; default false)"},
}

// boolFlag is a string flag that may be given without a value (`--pprof`
// means `--pprof=true`), for the run flags whose key is a boolean.
type boolFlag struct{ s *string }

func (b boolFlag) String() string {
	if b.s == nil {
		return ""
	}
	return *b.s
}
func (b boolFlag) Set(v string) error { *b.s = v; return nil }
func (b boolFlag) IsBoolFlag() bool   { return true }

// parseRun turns run's arguments and environment into the effective config.
// printConfig reports the hidden --print-config flag (print and exit), used by
// tests and by operators checking what a deployment will run with.
func parseRun(args []string, lookup func(string) (string, bool), stderr io.Writer) (cfg *config.Config, printConfig bool, err error) {
	fs := flag.NewFlagSet("rtproxy run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := fs.String("config", "", "YAML config file (also RTPROXY_CONFIG)")
	vals := map[string]*string{}
	for _, f := range runFlags {
		if f.flag == "pprof" {
			s := new(string)
			fs.Var(boolFlag{s}, f.flag, f.help)
			vals[f.flag] = s
			continue
		}
		vals[f.flag] = fs.String(f.flag, "", f.help)
	}
	fs.BoolVar(&printConfig, "print-config", false, "print the effective config (secrets redacted) and exit")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: rtproxy run [flags]\n\nFlags (each also a config key and an RTPROXY_* variable):\n")
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name != "print-config" {
				fmt.Fprintf(stderr, "  --%s\n    \t%s\n", f.Name, f.Usage)
			}
		})
	}
	if err := fs.Parse(args); err != nil {
		return nil, false, err
	}
	if fs.NArg() > 0 {
		return nil, false, fmt.Errorf("unexpected argument %q (run takes only flags)", fs.Arg(0))
	}
	set := map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		for _, rf := range runFlags {
			if rf.flag == f.Name {
				set[rf.key] = *vals[f.Name]
			}
		}
	})
	file := *configFile
	if file == "" {
		file, _ = lookup("RTPROXY_CONFIG")
	}
	cfg, err = config.Resolve(file, lookup, set)
	return cfg, printConfig, err
}

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	switch strings.ToLower(cfg.LogLevel) {
	case "debug":
		level = slog.LevelDebug
	case "warn", "warning":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if strings.ToLower(cfg.LogFormat) == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// newRegistry is the one registry every part registers on; /metrics serves it.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "rtproxy_build_info",
		Help: "Always 1; labels carry the rtproxy version and the Go version it was built with.",
	}, []string{"version", "goversion"})
	info.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(info)
	registerBudgets(reg)
	return reg
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	cfg, printConfig, err := parseRun(args, os.LookupEnv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "rtproxy run: %v\n", err)
		return 2
	}
	if printConfig {
		stdout.Write(cfg.Redacted().YAML())
		return 0
	}
	log := newLogger(cfg, stderr)
	for _, name := range config.UnknownEnv(os.Environ(), "RTPROXY_CONFIG") {
		log.Warn("environment variable is not an rtproxy setting; ignored (see docs/OPERATIONS.md)", "name", name)
	}
	if err := run(cfg, log); err != nil {
		log.Error("rtproxy stopped with an error", "err", err)
		return 1
	}
	return 0
}

// run starts every part, waits for a stop signal or a failure, and shuts
// down within the configured grace.
func run(cfg *config.Config, log *slog.Logger) error {
	// Everything the proxy writes (pipeline state, checkpoints, the embedded
	// cluster's data) may hold record contents and keys: owner only.
	syscall.Umask(0o077)
	setMemProfileRate(cfg.Pprof, os.Getenv("GODEBUG"))
	log.Info("rtproxy starting", "version", version, "listen", cfg.Listen, "admin_listen", cfg.AdminListen,
		"rules_dir", cfg.RulesDir, "state_dir", cfg.StateDir, "upstream", cfg.Upstream)
	if soft := setMemLimit("/", os.LookupEnv); soft > 0 {
		log.Info("Go memory limit set from the container's (GOMEMLIMIT unset)", "bytes", soft, "share", memLimitShare)
	}

	// Signals are caught from the start, so a SIGTERM during startup is a
	// clean stop rather than the default abrupt exit.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)

	applyLimits(cfg)
	reg := newRegistry()
	adm, err := newAdmin(cfg.AdminListen, reg, log.With("component", "admin"), cfg.Pprof)
	if err != nil {
		return err
	}
	adm.allowHosts(cfg.Admin.AllowedHosts)
	go adm.serve()
	log.Info("admin endpoints listening", "addr", adm.Addr())
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		adm.shutdown(ctx)
	}()

	ctlsCfg, err := clientTLS(cfg.TLS.Client)
	if err != nil {
		return err
	}
	utlsCfg, err := upstreamTLS(cfg.TLS.Upstream)
	if err != nil {
		return err
	}
	if cfg.TLS.Upstream.InsecureSkipVerify {
		log.Warn("tls.upstream.insecure_skip_verify is on: broker certificates are NOT verified")
	}

	upstream := cfg.Upstream
	var embedded *embeddedBrokers
	if cfg.Embedded() {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return fmt.Errorf("state_dir: %w", err)
		}
		if embedded, err = startEmbedded(cfg.StateDir, log); err != nil {
			return err
		}
		upstream = embedded.addrs
	}
	// The embedded cluster closes last: proxy connections and pipelines
	// still talk to it while they drain.
	defer func() {
		if embedded != nil {
			embedded.Close()
			log.Info("embedded broker closed")
		}
	}()

	if cfg.Embedded() && cfg.SchemaRegistry.URL == "" {
		// With the embedded broker, an embedded registry for Avro and
		// Protobuf routes (development only, embedded_registry.go).
		url, err := startEmbeddedRegistry(adm, cfg.StateDir, log)
		if err != nil {
			return err
		}
		cfg.SchemaRegistry.URL = url
	}

	popts, err := pipelineClientOpts(cfg, utlsCfg)
	if err != nil {
		return err
	}
	px, err := newProxy(cfg, upstream, ctlsCfg, utlsCfg, popts, log.With("component", "proxy"), reg)
	if err != nil {
		return err
	}
	// The registry bounds' counters, shared by routes and guards.
	srm, err := serde.NewMetrics(reg)
	if err != nil {
		return err
	}
	gd, err := newGuards(log.With("component", "guards"), reg, upstream, popts, schemaRegistryConfig(cfg, srm), px.SetGuards)
	if err != nil {
		return err
	}
	defer gd.close()
	vw, err := newViews(log.With("component", "views"), viewsSetter(px))
	if err != nil {
		return err
	}
	routes, err := newRoutes(cfg, upstream, popts, log, reg, srm, gd.apply, vw.apply)
	if err != nil {
		return err
	}
	if cfg.Proxy.Tap {
		px.SetTap(routes.Tap())
	}
	adm.setReady(func() (bool, string) {
		if !px.Ready() {
			return false, "upstream metadata not fetched yet"
		}
		if why := gd.notReady(); why != "" {
			return false, why // a guard fails closed (guards.go)
		}
		if why := vw.notReady(); why != "" {
			return false, why // a view fails closed (views.go)
		}
		return true, ""
	})
	adm.setRoutes(routes.Status)
	adm.setViews(vw.Status)
	adm.setDeadLetters(routes.RecentDeadLetters)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		part string
		err  error
	}
	done := make(chan result, 2)
	go func() { done <- result{"proxy", px.Run(ctx)} }()
	go func() { done <- result{"pipelines", routes.Run(ctx)} }()
	running := 2

	var failure error
wait:
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGHUP {
				log.Info("SIGHUP: reloading rules")
				routes.Reload()
				continue
			}
			log.Info("shutting down", "signal", s.String(), "grace", cfg.ShutdownGrace)
			break wait
		case r := <-done:
			running--
			// A part returning on its own, before any signal, is a failure
			// even without an error: the process would serve half its job.
			if r.err == nil {
				r.err = errors.New("stopped unexpectedly")
			}
			failure = fmt.Errorf("%s: %w", r.part, r.err)
			log.Error("a part stopped; shutting the rest down", "part", r.part, "err", r.err)
			break wait
		}
	}

	adm.stopping.Store(true)
	cancel()
	// The parts bound their own drain by shutdown_grace; the extra second
	// covers their final bookkeeping. Past that the process exits anyway:
	// an orchestrator's kill would be the only alternative.
	deadline := time.NewTimer(cfg.ShutdownGrace + time.Second)
	defer deadline.Stop()
	for running > 0 {
		select {
		case r := <-done:
			running--
			if r.err != nil && !errors.Is(r.err, context.Canceled) {
				log.Warn("error while stopping", "part", r.part, "err", r.err)
			}
		case s := <-sigs:
			log.Info("already shutting down; signal ignored", "signal", s.String())
		case <-deadline.C:
			log.Warn("shutdown grace exceeded; exiting without waiting further", "still_running", running)
			running = 0
		}
	}
	if failure == nil {
		log.Info("rtproxy stopped cleanly")
	}
	return failure
}

// Interfaces the wiring needs from the parts; adapters in proxy.go and
// routes.go bind them to protocol/ and pipeline/+rules/.
type (
	proxyServer interface {
		Run(ctx context.Context) error
		Ready() bool
		SetGuards(protocol.Guards)
		SetTap(protocol.Tap)
	}
	routeEngine interface {
		Run(ctx context.Context) error
		Status() any
		RecentDeadLetters(route string) []pipeline.DeadLetterInfo
		Reload()
		Tap() protocol.Tap
	}
)

// registerBudgets counts, on reg, the per-record budgets that tripped
// (operators/budget.go): expressions over their memory, steps or time,
// records over their fan-out, windows over their open states.
func registerBudgets(reg prometheus.Registerer) {
	for _, name := range operators.BudgetNames {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "rtproxy_budget_exceeded_total",
			Help:        "Records (or guard checks) refused because they went over a per-record budget (limits.*), by budget.",
			ConstLabels: prometheus.Labels{"budget": name},
		}, func() float64 { return float64(operators.BudgetTrips(name)) }))
	}
}

// applyLimits sets the per-record budgets of cfg (limits.*) for every
// expression and step the process evaluates: the proxy's, and check's and
// test's, which judge rule files as that proxy would.
func applyLimits(cfg *config.Config) {
	operators.SetLimits(operators.Limits{
		ExprBytes: cfg.Limits.ExprMemoryBytes, ExprSteps: cfg.Limits.ExprSteps, ExprTime: cfg.Limits.ExprTime,
		FanOut: cfg.Limits.MaxFanout, OpenWindows: cfg.Limits.MaxOpenWindows,
	})
}
