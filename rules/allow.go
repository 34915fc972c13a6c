package rules

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Allow is the proxy's allow-list of what a rule file may make the proxy
// read or reach on its behalf: environment variables and files holding
// secrets (schema_registry.*_env, *_file, ca_file) and the URLs those
// secrets are sent to (schema_registry.url, HTTP sinks). A rule file is
// written by whoever may edit the rules directory; the proxy's config by
// whoever runs the proxy. Without this list, a rule author could send any
// variable of the proxy's environment or any file it can read to any URL.
//
// The zero value, and a nil *Allow, is the safe default: no environment
// variable, only files inside the rules directory (RulesDir), and no URL.
// The proxy adds its own schema_registry.url to URLs (cmd/rtproxy), so a
// rule file may always name the registry the proxy already trusts.
//
// Every method returns nil when the name is allowed and otherwise an error
// that says what the config must hold to allow it. The error never
// carries the content of a variable or a file.
type Allow struct {
	// EnvNames are environment variable names a rule file may name, each
	// exact or a pattern with `*` (path.Match syntax, e.g. SR_*).
	EnvNames []string
	// Files are absolute paths a rule file may name: an entry allows that
	// path and everything beneath it (a directory of secrets); an entry
	// with `*`, `?` or `[` is a glob (filepath.Match syntax). Both are
	// matched against the file's resolved path (symlinks followed), so a
	// link cannot lead out of what is allowed.
	Files []string
	// URLs are prefixes of URLs a rule file may send requests (and
	// credentials) to: scheme, host and port must be equal, and the path
	// must be the prefix's path or below it ("https://sr:8081" allows
	// every path there; "https://api/v1" allows /v1 and /v1/x, not /v10).
	URLs []string
	// RulesDir is the rules directory; files inside it are allowed. The
	// loader sets it to the directory of the rule file it reads (In).
	RulesDir string
}

// In returns a copy of a (nil: the safe default) whose RulesDir is dir.
func (a *Allow) In(dir string) *Allow {
	out := &Allow{RulesDir: dir}
	if a != nil {
		out.EnvNames, out.Files, out.URLs = a.EnvNames, a.Files, a.URLs
	}
	return out
}

// ErrNotAllowed is wrapped by every refusal of Allow.
var ErrNotAllowed = errors.New("not allowed by the proxy's rules.allow")

// Env says whether a rule file may have the proxy read the environment
// variable name.
func (a *Allow) Env(name string) error {
	if a != nil {
		for _, p := range a.EnvNames {
			if ok, err := path.Match(p, name); err == nil && ok {
				return nil
			}
		}
	}
	return fmt.Errorf("the environment variable %s is %w: rule files may read only the variables listed in rules.allow.env of the proxy's config (none by default); add it there, or name a file inside the rules directory", name, ErrNotAllowed)
}

// File says whether a rule file may have the proxy read the file p
// (absolute, or relative to the working directory). A file that does not
// exist yet is judged by its path. A file that exists must be a regular
// file (a FIFO or device would hang the reader).
func (a *Allow) File(p string) error {
	abs, err := filepath.Abs(p)
	if err != nil {
		return fmt.Errorf("the file %s: %v", p, err)
	}
	real := abs
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		real = r
	}
	allowed := false
	if a != nil {
		if a.RulesDir != "" && withinDir(a.RulesDir, real) {
			allowed = true
		}
		for _, f := range a.Files {
			if allowed {
				break
			}
			allowed = fileEntryAllows(f, real)
		}
	}
	if !allowed {
		shown := abs
		if real != abs {
			shown = fmt.Sprintf("%s (a link to %s)", abs, real)
		}
		return fmt.Errorf("the file %s is outside the rules directory and %w: rule files may name files inside the rules directory, and those listed in rules.allow.files of the proxy's config", shown, ErrNotAllowed)
	}
	if fi, err := os.Stat(real); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("the file %s is not a regular file (%s)", real, fi.Mode().Type())
	}
	return nil
}

// fileEntryAllows reports whether one rules.allow.files entry allows the
// resolved path real.
func fileEntryAllows(entry, real string) bool {
	if entry == "" || !filepath.IsAbs(entry) {
		return false // config.Validate refuses these; never widen on a bad entry
	}
	entry = filepath.Clean(entry)
	if !strings.ContainsAny(entry, "*?[") {
		return withinDir(entry, real) // the file itself, or anything beneath the directory
	}
	ok, err := filepath.Match(entry, real)
	return err == nil && ok
}

// withinDir reports whether the resolved path real is dir or beneath it
// (dir's symlinks resolved too).
func withinDir(dir, real string) bool {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	rel, err := filepath.Rel(dir, real)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// URL says whether a rule file may have the proxy send requests to u.
func (a *Allow) URL(u string) error {
	c, err := parseAllowURL(u)
	if err != nil {
		return fmt.Errorf("the URL %s: %v", u, err)
	}
	if a != nil {
		for _, p := range a.URLs {
			if e, err := parseAllowURL(p); err == nil && urlAllows(e, c) {
				return nil
			}
		}
	}
	return fmt.Errorf("the URL %s is %w: rule files may send requests only to the proxy's own schema_registry.url and the prefixes in rules.allow.urls of the proxy's config", c.Redacted(), ErrNotAllowed)
}

// parseAllowURL parses an http(s) URL and normalises its host (lower case,
// the scheme's default port made explicit).
func parseAllowURL(s string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return nil, errors.New("not a URL")
	}
	u.Scheme = strings.ToLower(u.Scheme)
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, errors.New("must start with http:// or https://")
	}
	if u.Host == "" {
		return nil, errors.New("has no host")
	}
	if u.User != nil {
		return nil, errors.New("holds credentials")
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	u.Host = net.JoinHostPort(strings.ToLower(host), port)
	return u, nil
}

// urlAllows reports whether the prefix e allows c. Paths are compared
// decoded and cleaned, so /v1/../admin is not below /v1.
func urlAllows(e, c *url.URL) bool {
	if e.Scheme != c.Scheme || e.Host != c.Host {
		return false
	}
	ep := strings.TrimSuffix(path.Clean("/"+e.Path), "/")
	if ep == "" {
		return true
	}
	cp := path.Clean("/" + c.Path)
	return cp == ep || strings.HasPrefix(cp, ep+"/")
}
