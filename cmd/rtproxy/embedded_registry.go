package main

import (
	"log/slog"
	"net"
	"net/http"
	"path/filepath"

	"github.com/rtproxy/rtproxy/internal/srembed"
)

// embeddedRegistryPath is where the development schema registry is served
// on the admin listener.
const embeddedRegistryPath = "/schema-registry"

// startEmbeddedRegistry serves franz-go's srfake schema registry under
// /schema-registry on the admin listener, its schemas kept under
// state_dir/embedded-registry, and returns its URL. It runs with the
// embedded broker when no schema_registry is configured: for development
// only, like the broker.
func startEmbeddedRegistry(adm *admin, stateDir string, log *slog.Logger) (string, error) {
	file := filepath.Join(stateDir, "embedded-registry", "schemas.json")
	reg, err := srembed.Open(file, "")
	if err != nil {
		return "", err
	}
	reg.OnSaveError = func(err error) { log.Error("embedded schema registry: saving schemas", "file", file, "err", err) }
	adm.handle(embeddedRegistryPath+"/", http.StripPrefix(embeddedRegistryPath, reg.Handler()))
	host, port, _ := net.SplitHostPort(adm.Addr())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, port) + embeddedRegistryPath
	log.Warn("EMBEDDED DEVELOPMENT SCHEMA REGISTRY: no schema_registry is configured, so rtproxy serves an in-memory "+
		"Confluent-API registry (franz-go's srfake) on the admin listener. It is for development only: no authentication, "+
		"no compatibility guarantees of a real registry. Set schema_registry.url for a real one.",
		"url", url, "data", file)
	return url, nil
}
