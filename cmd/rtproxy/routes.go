package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/protocol"
	"github.com/rtproxy/rtproxy/rules"
)

// routes is the adapter to rules/ (loading and hot-reloading rule files) and
// pipeline/ (running them).
type routes struct {
	m       *pipeline.Manager
	dir     string
	opts    rules.Options
	log     *slog.Logger
	reg     prometheus.Registerer
	watcher atomic.Pointer[rules.Watcher]
	// guards receives the guard files of each rule set (guards.go), views
	// its view files (views.go).
	guards func([]*rules.Route)
	views  func([]*rules.Route)
}

func newRoutes(cfg *config.Config, seeds []string, opts []kgo.Opt, log *slog.Logger, reg prometheus.Registerer, srm *serde.Metrics, guards, views func([]*rules.Route)) (routeEngine, error) {
	if _, err := os.Stat(cfg.RulesDir); os.IsNotExist(err) {
		// An empty directory is a valid "no routes"; creating it lets the
		// watcher see the first rule file an operator drops in.
		if err := os.MkdirAll(cfg.RulesDir, 0o755); err != nil {
			return nil, fmt.Errorf("rules_dir: %w", err)
		}
		log.Info("rules_dir did not exist; created it empty", "component", "rules", "rules_dir", cfg.RulesDir)
	}
	redact, err := cfg.Admin.RedactPattern()
	if err != nil {
		return nil, fmt.Errorf("admin.redact_headers: %w", err)
	}
	m, err := pipeline.New(pipeline.Config{
		Seeds:      seeds,
		ClientOpts: opts,
		// A subdirectory, because state_dir also holds the embedded
		// broker's data.
		StateDir:   filepath.Join(cfg.StateDir, "pipelines"),
		Logger:     log.With("component", "pipeline"),
		Registerer: reg,
		// A stopping route waits this long for its outputs to be
		// acknowledged before its final checkpoint: the same budget
		// SIGTERM gives everything else.
		StopTimeout:    cfg.ShutdownGrace,
		StateRetention: cfg.StateRetention,
		GroupProtocol:  cfg.GroupProtocol,
		SessionTimeout: cfg.GroupSessionTimeout,
		BatchWindow:    cfg.BatchWindow,
		// The last dead letters of each route, for the status page.
		RecentValues:   cfg.Admin.ShowRecords,
		RedactHeader:   redact.MatchString,
		SchemaRegistry: schemaRegistryConfig(cfg, srm),
	})
	if err != nil {
		return nil, err
	}
	return &routes{m: m, dir: cfg.RulesDir, opts: rulesOptions(cfg), log: log, reg: reg, guards: guards, views: views}, nil
}

// apply hands the watcher's rule set to the pipelines. The watcher keeps a
// refused file's last valid route in routes and logs each error itself;
// the errors go to /routes next to their route.
func (r *routes) apply(rs []*rules.Route, errs []error) {
	var pipes, guards, views []*rules.Route
	for _, x := range rs {
		switch {
		case x.Guard != nil:
			guards = append(guards, x)
		case x.View != nil:
			views = append(views, x)
		default:
			pipes = append(pipes, x)
		}
	}
	if r.guards != nil {
		r.guards(guards)
	}
	if r.views != nil {
		r.views(views)
	}
	r.m.SetRuleErrors(errs)
	r.m.Apply(pipes)
}

func (r *routes) Status() any { return r.m.Status() }

// RecentDeadLetters is the route's last dead letters, for its status page.
func (r *routes) RecentDeadLetters(route string) []pipeline.DeadLetterInfo {
	return r.m.RecentDeadLetters(route)
}

// Tap is the produce-path tap into the pipelines (proxy.tap).
func (r *routes) Tap() protocol.Tap { return pipelineTap{r.m} }

// pipelineTap adapts the pipeline Manager to protocol.Tap.
type pipelineTap struct{ m *pipeline.Manager }

func (t pipelineTap) Wants(topic string) bool { return t.m.TapWants(topic) }

func (t pipelineTap) Acked(topic string, partition int32, base int64, recs []protocol.ProducedRecord) {
	trs := make([]pipeline.TapRecord, len(recs))
	for i, r := range recs {
		tr := pipeline.TapRecord{Key: r.Key, Value: r.Value, Timestamp: time.UnixMilli(r.Timestamp)}
		if len(r.Headers) > 0 {
			tr.Headers = make([]kgo.RecordHeader, len(r.Headers))
			for j, h := range r.Headers {
				tr.Headers[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
			}
		}
		trs[i] = tr
	}
	t.m.Tapped(topic, partition, base, trs) // copies what it keeps
}

// Reload is SIGHUP: the watcher re-reads the directory now. Before the
// watcher runs there is nothing to do: its first scan reads everything.
func (r *routes) Reload() {
	if w := r.watcher.Load(); w != nil {
		w.Reload()
	}
}

// Run watches the rules directory (the first scan applies the initial rule
// set before the pipelines start) and runs the pipelines until ctx is done.
func (r *routes) Run(ctx context.Context) error {
	w, err := rules.WatchWith(ctx, r.dir, r.opts, r.log.With("component", "rules"), r.reg, r.apply)
	if err != nil {
		return err
	}
	r.watcher.Store(w)
	err = r.m.Run(ctx)
	w.Close()
	return err
}

// rulesOptions is what the proxy's config tells the rules loader: where
// tables may be, and what rule files may name (rules.allow). The proxy's
// own schema_registry.url is always allowed: the proxy trusts it already.
func rulesOptions(cfg *config.Config) rules.Options {
	a := &rules.Allow{
		EnvNames: append([]string(nil), cfg.Rules.Allow.Env...),
		Files:    append([]string(nil), cfg.Rules.Allow.Files...),
		URLs:     append([]string(nil), cfg.Rules.Allow.URLs...),
	}
	for _, u := range strings.Split(cfg.SchemaRegistry.URL, ",") {
		if u = strings.TrimSpace(u); u != "" {
			a.URLs = append(a.URLs, u)
		}
	}
	return rules.Options{TablesDir: cfg.TablesDir, Allow: a}
}
