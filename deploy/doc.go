// Package deploy holds the packaging of rtproxy: the Helm chart
// (deploy/helm), the Grafana dashboard (deploy/grafana), the image's default
// config (deploy/docker) and the scripts that check them without a cluster
// or a Docker engine (deploy/scripts, deploy/deploycheck).
//
// The package itself has no code to import; its tests check that the
// dashboard queries only metrics the real binary exports. It must never be
// imported by the proxy.
package deploy
