package main

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// The admin listener answers only requests addressed to it (issue 25,
// "Smaller"):
//
//   - DNS rebinding: a page on evil.example whose name is made to resolve
//     to 127.0.0.1 has the browser send the proxy requests with
//     `Host: evil.example`, and read the answers as same-origin. So the
//     Host header must name the listener itself: an IP literal (no page can
//     be served from one by rebinding), localhost or a name under
//     .localhost, the host of admin_listen, or one of admin.allowed_hosts
//     (exact, or "*.example.com" for any name under example.com). Others
//     get 421 Misdirected Request.
//   - Cross-site writes: the listener is read-only but for the development
//     schema registry, whose POSTs and DELETEs a page elsewhere could send
//     as "simple" requests (text/plain, no preflight). A request that
//     changes something must come from the same origin (an Origin header,
//     when present, naming the Host the request was sent to; Sec-Fetch-Site,
//     when present, same-origin or none) and, with a body, carry a JSON
//     content type, which no cross-site form or simple request can. Others
//     get 403.
//
// Refusals are counted in rtproxy_admin_requests_refused_total{reason}.

type adminGuard struct {
	allowed atomic.Pointer[[]string] // admin.allowed_hosts, lower case
	own     string                   // the host of admin_listen, lower case
	refused *prometheus.CounterVec
	next    http.Handler
}

func newAdminGuard(listen string, allowed []string, reg prometheus.Registerer, next http.Handler) *adminGuard {
	g := &adminGuard{next: next}
	if h, _, err := net.SplitHostPort(listen); err == nil {
		g.own = strings.ToLower(h)
	}
	g.setAllowed(allowed)
	g.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rtproxy_admin_requests_refused_total",
		Help: "Requests the admin listener refused: host (a Host header that is not the listener's, admin.allowed_hosts: DNS rebinding), origin (a write from another origin), content_type (a write without a JSON body type).",
	}, []string{"reason"})
	if reg != nil {
		if err := reg.Register(g.refused); err != nil {
			if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
				g.refused = are.ExistingCollector.(*prometheus.CounterVec)
			}
		}
	}
	return g
}

// setAllowed sets admin.allowed_hosts.
func (g *adminGuard) setAllowed(hosts []string) {
	var l []string
	for _, a := range hosts {
		if a = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(a), ".")); a != "" {
			l = append(l, a)
		}
	}
	g.allowed.Store(&l)
}

// hostAllowed reports whether a request's Host header names this listener.
func (g *adminGuard) hostAllowed(hostport string) bool {
	if hostport == "" {
		return true // HTTP/1.0 without Host: no browser sends that
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if net.ParseIP(host) != nil {
		return true
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || (g.own != "" && host == g.own) {
		return true
	}
	for _, a := range *g.allowed.Load() {
		if a == host || (strings.HasPrefix(a, "*.") && strings.HasSuffix(host, a[1:])) {
			return true
		}
	}
	return false
}

// sameOrigin reports whether a write comes from the page it is addressed
// to (or from no browser page at all).
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true // not a browser's cross-origin request: browsers send Origin on every cross-origin write
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return false // "null" (sandboxed frames, file://) included
	}
	return strings.EqualFold(u.Host, r.Host)
}

func jsonBody(r *http.Request) bool {
	if r.ContentLength == 0 && r.Header.Get("Transfer-Encoding") == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

func (g *adminGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.hostAllowed(r.Host) {
		g.refused.WithLabelValues("host").Inc()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusMisdirectedRequest)
		fmt.Fprintf(w, "Host %q is not this admin listener's; add it to admin.allowed_hosts to reach it under that name\n", r.Host)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions {
		reason := ""
		switch {
		case !sameOrigin(r):
			reason = "origin"
		case !jsonBody(r) && !strings.HasPrefix(r.URL.Path, "/debug/pprof/"): // pprof's symbol lookups post plain text
			reason = "content_type"
		}
		if reason != "" {
			g.refused.WithLabelValues(reason).Inc()
			msg := "cross-origin writes are refused"
			if reason == "content_type" {
				msg = "a write must carry a JSON body (Content-Type application/json or application/vnd.schemaregistry.v1+json)"
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
	}
	g.next.ServeHTTP(w, r)
}
