package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/pipeline"
	"github.com/rtproxy/rtproxy/rules"
)

// routes is the adapter to rules/ (loading and watching rule files) and
// pipeline/ (running them).
type routes struct {
	m      *pipeline.Manager
	dir    string
	log    *slog.Logger
	reg    prometheus.Registerer
	reload chan struct{}
}

func newRoutes(cfg *config.Config, seeds []string, opts []kgo.Opt, log *slog.Logger, reg prometheus.Registerer) (routeEngine, error) {
	if _, err := os.Stat(cfg.RulesDir); os.IsNotExist(err) {
		// An empty directory is a valid "no routes"; creating it lets the
		// watcher see the first rule file an operator drops in.
		if err := os.MkdirAll(cfg.RulesDir, 0o755); err != nil {
			return nil, fmt.Errorf("rules_dir: %w", err)
		}
		log.Info("rules_dir did not exist; created it empty", "rules_dir", cfg.RulesDir)
	}
	m, err := pipeline.New(pipeline.Config{
		Seeds:      seeds,
		ClientOpts: opts,
		StateDir:   filepath.Join(cfg.StateDir, "pipelines"),
		Logger:     log,
		Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	r := &routes{m: m, dir: cfg.RulesDir, log: log, reg: reg, reload: make(chan struct{}, 1)}
	r.apply(rules.LoadDir(cfg.RulesDir))
	return r, nil
}

// apply hands a loaded rule set to the pipelines and logs each rule error
// (they carry file:line:col).
func (r *routes) apply(rs []*rules.Route, errs []error) {
	for _, err := range errs {
		r.log.Error("rule file rejected", "err", err)
	}
	names := make([]string, 0, len(rs))
	for _, rt := range rs {
		names = append(names, rt.Name)
	}
	r.log.Info("rules loaded", "routes", names, "errors", len(errs))
	r.m.SetRuleErrors(errs)
	r.m.Apply(rs)
}

func (r *routes) Status() any { return r.m.Status() }

// Reload asks for a forced reload (SIGHUP). A reload already pending absorbs
// this one.
func (r *routes) Reload() {
	select {
	case r.reload <- struct{}{}:
	default:
	}
}

func (r *routes) Run(ctx context.Context) error {
	return r.m.Run(ctx)
}
