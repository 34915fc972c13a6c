// Command rtproxy is the rtproxy binary: a Kafka-protocol sidecar proxy that
// forwards every client request unchanged and runs real-time pipelines for
// the topics its rule files route.
//
// This package owns the command line (run, check, version, demo), turns the
// config into the parts' own configs, wires protocol/, pipeline/ and rules/
// together, serves the admin HTTP endpoints and handles signals. It is the
// only package allowed to import all the others; nothing imports it.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
)

// version is stamped at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

const usage = `rtproxy: a Kafka sidecar proxy with real-time pipelines

Usage:
  rtproxy run [--config FILE] [--listen ADDR] [--advertise-host HOST] [--broker-ports FIRST]
              [--upstream HOST:PORT[,HOST:PORT...]] [--rules-dir DIR] [--state-dir DIR]
              [--admin-listen ADDR] [--log-level LEVEL]
  rtproxy check [--config FILE] PATH...  lint rule files or directories; exit 1 on any problem
  rtproxy test [-v] [--run REGEXP] [--format text|json] PATH...
                                   run the tests beside rule files (NAME.test.yaml);
                                   exit 1 when one fails, 2 on a malformed test file
  rtproxy state list|drop ROUTE    list routes with kept state, or drop one (proxy stopped)
  rtproxy version                  print the version
  rtproxy demo produce [--bootstrap ADDR] [--topic T] [--rate N] [--count N]
                                   produce sample payment records

Every run flag is also a config file key and an RTPROXY_* environment variable
(--rules-dir: rules_dir, RTPROXY_RULES_DIR). Flags win over the environment,
the environment wins over the file. See docs/OPERATIONS.md.
`

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// realMain runs one subcommand and returns the process exit code: 0 success,
// 1 a failure at run time or problems found by check, 2 bad usage or config.
func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "check":
		return cmdCheck(args[1:], stdout, stderr)
	case "test":
		return cmdTest(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "rtproxy %s (%s %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	case "demo":
		return cmdDemo(args[1:], stdout, stderr)
	case "state":
		return cmdState(args[1:], stdout, stderr)
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "rtproxy: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}
