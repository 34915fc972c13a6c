// Command srfakebroker runs franz-go's srfake schema registry as its own
// process, so that tests talk to a registry over a real loopback socket and
// can stop and restart it like a real one. With -state the registered
// schemas are written to a file after every change and read back at start:
// a restarted registry keeps its subjects, versions and ids.
//
// It prints one line "ready URL" on stdout once it listens, and runs until
// SIGTERM/SIGINT.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

func main() {
	var (
		port  = flag.Int("port", 0, "port to listen on (default: random)")
		state = flag.String("state", "", "keep the registered schemas in this file across restarts")
		auth  = flag.String("auth", "", "require this exact Authorization header (e.g. \"Bearer t0k3n\")")
	)
	flag.Parse()

	var opts []srfake.Option
	if *auth != "" {
		opts = append(opts, srfake.WithAuth(*auth))
	}
	reg := srfake.NewRegistry(opts...)
	if *state != "" {
		if err := load(reg, *state); err != nil {
			log.Fatalf("srfakebroker: %v", err)
		}
	}
	h := reg.Handler()
	if *state != "" {
		h = persisting(reg, h, *state, *auth)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(*port))
	if err != nil {
		log.Fatalf("srfakebroker: %v", err)
	}
	srv := &http.Server{Handler: h}
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.Fatalf("srfakebroker: %v", err)
		}
	}()
	fmt.Printf("ready http://%s\n", ln.Addr())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	srv.Close()
}

// persisting writes the registry's schemas to file after every request that
// changed something.
func persisting(reg *srfake.Registry, h http.Handler, file, auth string) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			h.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		h.ServeHTTP(w, r)
		if err := save(reg.Handler(), file, auth); err != nil {
			log.Printf("srfakebroker: saving %s: %v", file, err)
		}
	})
}

// get serves one GET request in process.
func get(h http.Handler, path, auth string, into any) error {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, rec.Code, rec.Body.String())
	}
	return json.Unmarshal(rec.Body.Bytes(), into)
}

func save(h http.Handler, file, auth string) error {
	var subjects []string
	if err := get(h, "/subjects", auth, &subjects); err != nil {
		return err
	}
	var all []sr.SubjectSchema
	for _, s := range subjects {
		var versions []int
		if err := get(h, "/subjects/"+url.PathEscape(s)+"/versions", auth, &versions); err != nil {
			return err
		}
		for _, v := range versions {
			var ss sr.SubjectSchema
			if err := get(h, "/subjects/"+url.PathEscape(s)+"/versions/"+strconv.Itoa(v), auth, &ss); err != nil {
				return err
			}
			all = append(all, ss)
		}
	}
	b, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(file), "."+filepath.Base(file)+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

func load(reg *srfake.Registry, file string) error {
	b, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var all []sr.SubjectSchema
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&all); err != nil {
		return fmt.Errorf("%s: %w", file, err)
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
			if _, _, err := reg.RegisterSchema(ss.Subject, ss.Schema); err != nil {
				return fmt.Errorf("%s: %s version %d: %w", file, ss.Subject, ss.Version, err)
			}
			continue
		}
		seen[ss.ID] = true
		reg.SeedSchema(ss.Subject, ss.Version, ss.ID, ss.Schema)
	}
	return nil
}
