// Command srfakebroker runs franz-go's srfake schema registry as its own
// process, so that tests talk to a registry over a real loopback socket and
// can stop and restart it like a real one. With -state the registered
// schemas are written to a file after every change and read back at start
// (internal/srembed): a restarted registry keeps its subjects, versions and
// ids.
//
// It prints one line "ready URL" on stdout once it listens, and runs until
// SIGTERM/SIGINT.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/rtproxy/rtproxy/internal/srembed"
)

func main() {
	var (
		port  = flag.Int("port", 0, "port to listen on (default: random)")
		state = flag.String("state", "", "keep the registered schemas in this file across restarts")
		auth  = flag.String("auth", "", "require this exact Authorization header (e.g. \"Bearer t0k3n\")")
	)
	flag.Parse()

	reg, err := srembed.Open(*state, *auth)
	if err != nil {
		log.Fatalf("srfakebroker: %v", err)
	}
	reg.OnSaveError = func(err error) { log.Printf("srfakebroker: saving %s: %v", *state, err) }
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(*port))
	if err != nil {
		log.Fatalf("srfakebroker: %v", err)
	}
	srv := &http.Server{Handler: reg.Handler()}
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
