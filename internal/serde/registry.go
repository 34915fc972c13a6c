package serde

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// Config says how to reach a schema registry. Secrets are never written in
// it: they come from a file or an environment variable it names.
type Config struct {
	URL string // e.g. http://registry:8081; several comma-separated
	// BasicAuthFile holds "user:password" (one line); BasicAuthEnv names
	// an environment variable that holds it.
	BasicAuthFile string
	BasicAuthEnv  string
	// BearerTokenFile holds a bearer token; BearerTokenEnv names an
	// environment variable that holds one.
	BearerTokenFile string
	BearerTokenEnv  string
	// CAFile is the CA (PEM) the registry's certificate is verified
	// against; empty: the system roots.
	CAFile string
	// Timeout bounds one request to the registry. Zero: 10s.
	Timeout time.Duration
	// Limits bound the registry's answers and schemas (bounds.go); zero
	// fields take the defaults. They come from the proxy's config only: a
	// rule file's own schema_registry cannot raise them.
	Limits Limits
	// Metrics count the refusals for a bound; nil counts nothing.
	Metrics *Metrics
}

// Set reports whether a registry is configured.
func (c Config) Set() bool { return strings.TrimSpace(c.URL) != "" }

// Check refuses a configuration that cannot work, without reading files.
func (c Config) Check() error {
	if !c.Set() {
		return errors.New("no url")
	}
	for _, u := range strings.Split(c.URL, ",") {
		u = strings.TrimSpace(u)
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return fmt.Errorf("url %q must start with http:// or https://", u)
		}
	}
	basic := c.BasicAuthFile != "" || c.BasicAuthEnv != ""
	bearer := c.BearerTokenFile != "" || c.BearerTokenEnv != ""
	if basic && bearer {
		return errors.New("basic auth and a bearer token are both set; use one")
	}
	if c.BasicAuthFile != "" && c.BasicAuthEnv != "" {
		return errors.New("basic_auth_file and basic_auth_env are both set; use one")
	}
	if c.BearerTokenFile != "" && c.BearerTokenEnv != "" {
		return errors.New("bearer_token_file and bearer_token_env are both set; use one")
	}
	if c.Timeout < 0 {
		return fmt.Errorf("timeout must be positive, got %s", c.Timeout)
	}
	return nil
}

// Secret reads a secret from a file or an environment variable (lookup:
// os.LookupEnv), trimmed: the one way the proxy resolves a secret a rule
// file names (the registry's credentials, an HTTP sink's headers).
func Secret(file, env string, lookup func(string) (string, bool)) (string, error) {
	return secret(file, env, lookup)
}

// secret reads a secret from a file or an environment variable.
func secret(file, env string, lookup func(string) (string, bool)) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(b)), nil
	}
	v, ok := lookup(env)
	if !ok || strings.TrimSpace(v) == "" {
		return "", fmt.Errorf("environment variable %s is not set", env)
	}
	return strings.TrimSpace(v), nil
}

// client builds the sr.Client of c; lookup reads the environment
// (os.LookupEnv).
func (c Config) client(lookup func(string) (string, bool)) (*sr.Client, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	var urls []string
	for _, u := range strings.Split(c.URL, ",") {
		urls = append(urls, strings.TrimRight(strings.TrimSpace(u), "/"))
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	lim := c.Limits.withDefaults()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no PEM certificate in it", c.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	limited := &limitTransport{rt: tr, max: lim.MaxResponseBytes, m: c.Metrics}
	opts := []sr.ClientOpt{sr.URLs(urls...), sr.HTTPClient(&http.Client{Transport: limited, Timeout: timeout}), sr.UserAgent("rtproxy")}
	switch {
	case c.BasicAuthFile != "" || c.BasicAuthEnv != "":
		s, err := secret(c.BasicAuthFile, c.BasicAuthEnv, lookup)
		if err != nil {
			return nil, fmt.Errorf("basic auth: %w", err)
		}
		user, pass, ok := strings.Cut(s, ":")
		if !ok {
			return nil, errors.New("basic auth: want user:password")
		}
		opts = append(opts, sr.BasicAuth(user, pass))
	case c.BearerTokenFile != "" || c.BearerTokenEnv != "":
		s, err := secret(c.BearerTokenFile, c.BearerTokenEnv, lookup)
		if err != nil {
			return nil, fmt.Errorf("bearer token: %w", err)
		}
		opts = append(opts, sr.BearerToken(s))
	}
	return sr.NewClient(opts...)
}

// Registry is a schema registry client with a cache of compiled schemas:
// each id is fetched once. Safe for concurrent use.
type Registry struct {
	cl  *sr.Client
	lim Limits
	met *Metrics

	mu   sync.RWMutex
	byID map[int]*entry
}

// entry is one id's schema: being fetched (done open), compiled, or known
// bad (err, kept negTTL so a flood of records with that id does not flood
// the registry).
type entry struct {
	done chan struct{}
	s    *Schema
	err  error
	at   time.Time
}

// negTTL is how long an unknown or uncompilable schema id is remembered.
const negTTL = 10 * time.Second

// NewRegistry connects nothing yet: the first lookup does.
func NewRegistry(c Config, lookup func(string) (string, bool)) (*Registry, error) {
	cl, err := c.client(lookup)
	if err != nil {
		return nil, fmt.Errorf("schema_registry: %w", err)
	}
	return &Registry{cl: cl, lim: c.Limits.withDefaults(), met: c.Metrics, byID: map[int]*entry{}}, nil
}

// Client is the registry's sr.Client.
func (r *Registry) Client() *sr.Client { return r.cl }

// Cached reports whether id needs no request: its schema (or its refusal)
// is known.
func (r *Registry) Cached(id int) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e := r.byID[id]
	if e == nil {
		return false
	}
	select {
	case <-e.done:
		return e.err == nil || time.Since(e.at) < negTTL
	default:
		return false
	}
}

// Schema is the compiled schema of id. The error is a *DecodeError when
// the registry does not know id or its schema does not compile, an
// *UnavailableError when the registry cannot be asked now.
func (r *Registry) Schema(ctx context.Context, id int) (*Schema, error) {
	// The path of every record: a schema fetched before.
	r.mu.RLock()
	if e := r.byID[id]; e != nil && isClosed(e.done) && e.err == nil {
		r.mu.RUnlock()
		return e.s, nil
	}
	r.mu.RUnlock()
	r.mu.Lock()
	e := r.byID[id]
	var prev *entry
	if e != nil {
		select {
		case <-e.done:
			if e.err == nil || time.Since(e.at) < negTTL {
				r.mu.Unlock()
				return e.s, e.err
			}
			prev, e = e, nil // a refusal that expired: ask again
		default:
		}
	}
	if e == nil {
		e = &entry{done: make(chan struct{})}
		r.byID[id] = e
		r.mu.Unlock()
		e.s, e.err = r.fetch(ctx, id)
		e.at = time.Now()
		if e.err != nil && IsUnavailable(e.err) {
			if prev != nil {
				// Known bad, and the registry cannot say otherwise now.
				e.s, e.err = prev.s, prev.err
			} else {
				r.mu.Lock()
				if r.byID[id] == e {
					delete(r.byID, id) // the next record asks again
				}
				r.mu.Unlock()
			}
		}
		close(e.done)
		return e.s, e.err
	}
	r.mu.Unlock()
	select {
	case <-e.done:
		return e.s, e.err
	case <-ctx.Done():
		return nil, &UnavailableError{ID: id, Err: ctx.Err()}
	}
}

// permanent reports whether a registry error means "no such schema" (or
// subject or version) rather than "cannot ask now".
func permanent(err error) bool {
	var re *sr.ResponseError
	if !errors.As(err, &re) {
		return false
	}
	return re.StatusCode == http.StatusNotFound || re.StatusCode == http.StatusUnprocessableEntity
}

func (r *Registry) fetch(ctx context.Context, id int) (*Schema, error) {
	s, err := r.cl.SchemaByID(ctx, id)
	if err != nil {
		if IsBound(err) {
			return nil, &DecodeError{ID: id, HasID: true, Err: boundOnly(err)}
		}
		if permanent(err) {
			return nil, &DecodeError{ID: id, HasID: true, Err: fmt.Errorf("the registry has no schema with this id: %v", err)}
		}
		return nil, &UnavailableError{ID: id, Err: err}
	}
	if len(s.References) > r.lim.MaxReferences {
		r.met.trip(boundRefs)
		return nil, &DecodeError{ID: id, HasID: true, Err: &BoundError{Bound: boundRefs, Msg: fmt.Sprintf("the schema has %d references, more than %d", len(s.References), r.lim.MaxReferences)}}
	}
	budget := r.lim.MaxReferences
	refs, err := r.references(ctx, s.References, map[string]bool{}, &budget)
	if err != nil {
		if IsBound(err) {
			return nil, &DecodeError{ID: id, HasID: true, Err: boundOnly(err)}
		}
		if IsUnavailable(err) {
			return nil, &UnavailableError{ID: id, Err: err}
		}
		return nil, &DecodeError{ID: id, HasID: true, Err: err}
	}
	if err := checkSchemaBounds(r.lim, r.met, s.Type, s.Schema, refs); err != nil {
		return nil, &DecodeError{ID: id, HasID: true, Err: err}
	}
	c, err := compile(id, s, refs)
	if err != nil {
		return nil, &DecodeError{ID: id, HasID: true, Err: err}
	}
	return c, nil
}

// reference is one schema a schema references, by the name it is
// referenced by (an Avro full name, a .proto import path).
type reference struct {
	name   string
	schema string
}

// references fetches the schemas refs name and theirs, dependencies first.
// budget is how many more may be fetched (max_references): it bounds the
// count and so the depth of the tree; seen breaks cycles.
func (r *Registry) references(ctx context.Context, refs []sr.SchemaReference, seen map[string]bool, budget *int) ([]reference, error) {
	var out []reference
	for _, ref := range refs {
		if seen[ref.Name] {
			continue
		}
		seen[ref.Name] = true
		if *budget <= 0 {
			r.met.trip(boundRefs)
			return nil, &BoundError{Bound: boundRefs, Msg: fmt.Sprintf("the schema's references (and theirs) are more than %d", r.lim.MaxReferences)}
		}
		*budget--
		ss, err := r.cl.SchemaByVersion(ctx, ref.Subject, ref.Version)
		if err != nil {
			if IsBound(err) {
				return nil, boundOnly(err)
			}
			if permanent(err) {
				return nil, fmt.Errorf("reference %q (subject %q version %d): %v", ref.Name, ref.Subject, ref.Version, err)
			}
			return nil, &UnavailableError{Subject: ref.Subject, Err: err}
		}
		deps, err := r.references(ctx, ss.References, seen, budget)
		if err != nil {
			return nil, err
		}
		out = append(out, deps...)
		out = append(out, reference{name: ref.Name, schema: ss.Schema.Schema})
	}
	return out, nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// boundOnly is the *BoundError in err, without the HTTP client's wrapping
// (method and URL), which says nothing more.
func boundOnly(err error) error {
	var b *BoundError
	if errors.As(err, &b) {
		return b
	}
	return err
}
