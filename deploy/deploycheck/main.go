// Command deploycheck checks the packaging against itself, for the scripts
// in deploy/scripts (there is no Kubernetes cluster and no Docker engine in
// CI, so what can be checked is checked statically):
//
//	deploycheck manifest -rendered FILE [-rules-out DIR] [-workloads N] [-replicas N]
//	    reads `helm template` output; loads the rendered rtproxy.yaml with
//	    the proxy's own config loader (config.Resolve); checks that every
//	    rtproxy container, its probes, mounts and Services agree with that
//	    config, and with -replicas that every workload running the proxy
//	    has N replicas; writes the rules ConfigMap's files to DIR for
//	    `rtproxy check`.
//	deploycheck image -dockerfile FILE -rendered FILE -image-config FILE [-build-out PATH]
//	    parses the Dockerfile; checks its user, paths, ports and command
//	    against the rendered chart and the image's default config; with
//	    -build-out, runs the Dockerfile's own `go build` line on this host.
//
// Every problem is printed, one per line, and the exit status is 1 if there
// was any. It lives under deploy/ because it checks deploy/; it imports only
// config/ from this module.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: deploycheck manifest|image [flags]")
		return 2
	}
	var problems []string
	var err error
	switch args[0] {
	case "manifest":
		fs := flag.NewFlagSet("manifest", flag.ContinueOnError)
		fs.SetOutput(stderr)
		rendered := fs.String("rendered", "", "helm template output")
		rulesOut := fs.String("rules-out", "", "directory to write the rendered rule files to")
		workloads := fs.Int("workloads", 1, "number of pods with an rtproxy container expected (0 for a sidecar-mode chart on its own)")
		replicas := fs.Int("replicas", -1, "spec.replicas every workload with an rtproxy container must have (-1: not checked)")
		if fs.Parse(args[1:]) != nil {
			return 2
		}
		var m *Manifest
		m, err = LoadManifest(*rendered)
		if err == nil {
			problems = m.Check(*workloads)
			if *replicas >= 0 {
				problems = append(problems, m.CheckReplicas(*replicas)...)
			}
			if *rulesOut != "" {
				var n int
				n, err = m.WriteRules(*rulesOut)
				if err == nil {
					fmt.Fprintf(stdout, "deploycheck: wrote %d rule file(s) to %s\n", n, *rulesOut)
				}
			}
		}
	case "image":
		fs := flag.NewFlagSet("image", flag.ContinueOnError)
		fs.SetOutput(stderr)
		dockerfile := fs.String("dockerfile", "Dockerfile", "the Dockerfile")
		dockerignore := fs.String("dockerignore", ".dockerignore", "the .dockerignore")
		rendered := fs.String("rendered", "", "helm template output of the chart in standalone mode")
		imageConfig := fs.String("image-config", "deploy/docker/rtproxy.yaml", "the config the Dockerfile copies into the image")
		buildOut := fs.String("build-out", "", "run the Dockerfile's go build here (path of the binary)")
		version := fs.String("version", "image-check", "VERSION build arg for -build-out")
		if fs.Parse(args[1:]) != nil {
			return 2
		}
		problems, err = CheckImage(ImageCheck{
			Dockerfile:   *dockerfile,
			Dockerignore: *dockerignore,
			Rendered:     *rendered,
			ImageConfig:  *imageConfig,
			BuildOut:     *buildOut,
			Version:      *version,
			Log:          stdout,
		})
	default:
		fmt.Fprintf(stderr, "deploycheck: unknown command %q (want manifest or image)\n", args[0])
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "deploycheck %s: %v\n", args[0], err)
		return 1
	}
	for _, p := range problems {
		fmt.Fprintf(stderr, "deploycheck %s: %s\n", args[0], p)
	}
	if len(problems) > 0 {
		return 1
	}
	fmt.Fprintf(stdout, "deploycheck %s: ok\n", args[0])
	return 0
}
