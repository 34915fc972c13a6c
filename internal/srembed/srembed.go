// Package srembed serves franz-go's srfake schema registry with its
// schemas kept in a file, so that a restarted registry keeps its subjects,
// versions and ids. test/srfakebroker runs it as a process for tests;
// `rtproxy run` serves it on the admin listener as the development
// registry when it runs the embedded broker and no schema_registry is
// configured. Neither is a production registry.
package srembed

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// Registry is an srfake registry whose schemas live in a file.
type Registry struct {
	reg  *srfake.Registry
	file string
	auth string
	mu   sync.Mutex
	// OnSaveError is told when the file could not be written.
	OnSaveError func(error)
}

// Open loads the schemas of file (when it exists) into a new registry
// that requires the Authorization header auth (none when empty).
func Open(file, auth string) (*Registry, error) {
	var opts []srfake.Option
	if auth != "" {
		opts = append(opts, srfake.WithAuth(auth))
	}
	r := &Registry{reg: srfake.NewRegistry(opts...), file: file, auth: auth}
	if file != "" {
		if err := r.load(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Handler serves the registry's REST API and saves the schemas after each
// request that may have changed them.
func (r *Registry) Handler() http.Handler {
	h := r.reg.Handler()
	if r.file == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet || req.Method == http.MethodHead {
			h.ServeHTTP(w, req)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		h.ServeHTTP(w, req)
		if err := r.save(); err != nil && r.OnSaveError != nil {
			r.OnSaveError(err)
		}
	})
}

func (r *Registry) get(path string, into any) error {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if r.auth != "" {
		req.Header.Set("Authorization", r.auth)
	}
	rec := httptest.NewRecorder()
	r.reg.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, rec.Code, rec.Body.String())
	}
	return json.Unmarshal(rec.Body.Bytes(), into)
}

func (r *Registry) save() error {
	var subjects []string
	if err := r.get("/subjects", &subjects); err != nil {
		return err
	}
	var all []sr.SubjectSchema
	for _, s := range subjects {
		var versions []int
		if err := r.get("/subjects/"+url.PathEscape(s)+"/versions", &versions); err != nil {
			return err
		}
		for _, v := range versions {
			var ss sr.SubjectSchema
			if err := r.get("/subjects/"+url.PathEscape(s)+"/versions/"+strconv.Itoa(v), &ss); err != nil {
				return err
			}
			all = append(all, ss)
		}
	}
	b, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(r.file), 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(r.file), "."+filepath.Base(r.file)+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.file)
}

func (r *Registry) load() error {
	b, err := os.ReadFile(r.file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var all []sr.SubjectSchema
	if err := json.Unmarshal(b, &all); err != nil {
		return fmt.Errorf("%s: %w", r.file, err)
	}
	// Ids in order: a schema's references were registered before it.
	sort.Slice(all, func(i, j int) bool {
		if all[i].ID != all[j].ID {
			return all[i].ID < all[j].ID
		}
		return all[i].Version < all[j].Version
	})
	seen := map[int]bool{}
	for _, ss := range all {
		if seen[ss.ID] {
			// srfake seeds an id once; the same schema under another
			// subject is registered, which finds the existing id.
			if _, _, err := r.reg.RegisterSchema(ss.Subject, ss.Schema); err != nil {
				return fmt.Errorf("%s: %s version %d: %w", r.file, ss.Subject, ss.Version, err)
			}
			continue
		}
		seen[ss.ID] = true
		if err := seed(r.reg, ss); err != nil {
			return fmt.Errorf("%s: %w", r.file, err)
		}
	}
	return nil
}

// seed is srfake's SeedSchema, which panics on a conflict, as an error.
func seed(reg *srfake.Registry, ss sr.SubjectSchema) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s version %d (id %d): %v", ss.Subject, ss.Version, ss.ID, p)
		}
	}()
	reg.SeedSchema(ss.Subject, ss.Version, ss.ID, ss.Schema)
	return nil
}
