package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rtproxy/rtproxy/pipeline"
)

// admin is the operator-facing HTTP server: the status pages (/ and
// /route/NAME), /metrics, /healthz, /readyz and /routes.
type admin struct {
	log      *slog.Logger
	srv      *http.Server
	mux      *http.ServeMux
	ln       net.Listener
	stopping atomic.Bool
	trends   *trends // the status page's sparklines, sampled while serving
	// guard checks every request's Host, and writes' origin
	// (adminguard.go).
	guard *adminGuard

	// The server answers from the moment it listens; the parts behind
	// these are wired in later, while requests may be running.
	mu struct {
		sync.Mutex
		ready  func() (bool, string) // readiness and, when not ready, why
		routes func() any            // the pipeline manager's status; nil: no routes
		// deadLetters is a route's last dead letters, for its page.
		deadLetters func(route string) []pipeline.DeadLetterInfo
		// views lists the views in force (views.go); nil: none.
		views func() []viewStatus
	}
}

// setReady wires the readiness check.
func (a *admin) setReady(fn func() (bool, string)) {
	a.mu.Lock()
	a.mu.ready = fn
	a.mu.Unlock()
}

// setRoutes wires the /routes source.
func (a *admin) setRoutes(fn func() any) {
	a.mu.Lock()
	a.mu.routes = fn
	a.mu.Unlock()
}

// setViews wires the views /routes and the status page list.
func (a *admin) setViews(fn func() []viewStatus) {
	a.mu.Lock()
	a.mu.views = fn
	a.mu.Unlock()
}

func (a *admin) viewsHook() func() []viewStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.views
}

// setDeadLetters wires the source of the route pages' last dead letters.
func (a *admin) setDeadLetters(fn func(route string) []pipeline.DeadLetterInfo) {
	a.mu.Lock()
	a.mu.deadLetters = fn
	a.mu.Unlock()
}

func (a *admin) deadLetters() func(string) []pipeline.DeadLetterInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.deadLetters
}

func (a *admin) hooks() (func() (bool, string), func() any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.ready, a.mu.routes
}

func newAdmin(addr string, reg *prometheus.Registry, log *slog.Logger, profiles bool) (*admin, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin_listen %s: %w", addr, err)
	}
	a := &admin{log: log, ln: ln}
	a.mu.ready = func() (bool, string) { return false, "starting" }
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelError),
		Registry:          reg, // rtproxy's own promhttp_* counters
		EnableOpenMetrics: true,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", a.serveReady)
	mux.HandleFunc("GET /routes", a.serveRoutes)
	page := &statusPage{reg: reg, started: time.Now(), trends: newTrends(reg, trendInterval, trendWindow)}
	a.trends = page.trends
	pageReady := func(ready func() (bool, string)) func() (bool, string) {
		return func() (bool, string) {
			if a.stopping.Load() {
				return false, "shutting down"
			}
			return ready()
		}
	}
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		ready, routes := a.hooks()
		page.serve(w, r, pageReady(ready), routes, a.viewsHook())
	})
	mux.HandleFunc("GET /route/{name}", func(w http.ResponseWriter, r *http.Request) {
		ready, routes := a.hooks()
		page.serveRoute(w, r, pageReady(ready), routes, a.deadLetters())
	})
	if profiles {
		// Opt-in (pprof): Go's profiles, for `go tool pprof URL`.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		log.Info("serving Go profiles under /debug/pprof/ (pprof: true)", "admin_listen", addr)
	}
	a.mux = mux
	a.guard = newAdminGuard(ln.Addr().String(), nil, reg, mux)
	if h, _, err := net.SplitHostPort(addr); err == nil && net.ParseIP(h) == nil && h != "" {
		a.guard.own = strings.ToLower(h) // admin_listen names a host: its own name is allowed
	}
	a.srv = &http.Server{
		Handler:           a.guard,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return a, nil
}

// allowHosts sets the Host names the listener answers besides its own
// address and localhost (admin.allowed_hosts).
func (a *admin) allowHosts(hosts []string) { a.guard.setAllowed(hosts) }

// handle serves h under pattern too (the embedded schema registry).
func (a *admin) handle(pattern string, h http.Handler) { a.mux.Handle(pattern, h) }

// Addr is the bound address (useful when admin_listen asked for port 0).
func (a *admin) Addr() string { return a.ln.Addr().String() }

func (a *admin) serve() {
	stop := a.trends.run(func() func() any { _, routes := a.hooks(); return routes })
	defer stop()
	if err := a.srv.Serve(a.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		a.log.Error("admin server stopped", "err", err)
	}
}

func (a *admin) serveReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if a.stopping.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready: shutting down")
		return
	}
	ready, _ := a.hooks()
	if ok, why := ready(); !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %s\n", why)
		return
	}
	fmt.Fprintln(w, "ready")
}

func (a *admin) serveRoutes(w http.ResponseWriter, _ *http.Request) {
	var v any = []any{}
	if _, routes := a.hooks(); routes != nil {
		if s := routes(); s != nil {
			v = s
		}
	}
	// Views follow the routes, each with "kind": "view" (views.go).
	if vs := a.viewsHook(); vs != nil {
		if list := vs(); len(list) > 0 {
			v = withViews(v, list)
		}
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, "encode routes: "+err.Error(), http.StatusInternalServerError)
		return
	}
	// A typed nil slice marshals as null; /routes promises a list.
	if string(b) == "null" {
		b = []byte("[]")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}

// withViews is the list routes (a slice of route statuses) with the views
// after them.
func withViews(routes any, views []viewStatus) []any {
	var out []any
	if rv := reflect.ValueOf(routes); rv.Kind() == reflect.Slice {
		for i := 0; i < rv.Len(); i++ {
			out = append(out, rv.Index(i).Interface())
		}
	}
	for _, v := range views {
		out = append(out, v)
	}
	return out
}

// shutdown stops the server, letting in-flight scrapes finish within ctx.
func (a *admin) shutdown(ctx context.Context) {
	if err := a.srv.Shutdown(ctx); err != nil {
		a.srv.Close()
	}
}
