// Command kfakebroker runs franz-go's kfake as its own process, so that
// tests and benchmarks talk to a broker over real loopback sockets and can
// kill and restart it (with -data-dir) like a real one.
//
// It prints one line "ready ADDR,ADDR,..." on stdout once it listens, and
// runs until SIGTERM/SIGINT.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func main() {
	var (
		brokers = flag.Int("brokers", 3, "number of brokers")
		ports   = flag.String("ports", "", "comma-separated ports, one per broker (default: random)")
		dataDir = flag.String("data-dir", "", "persist data here so a restart keeps it")
		topics  = flag.String("topics", "", "comma-separated NAME:PARTITIONS to create up front")
		parts   = flag.Int("default-partitions", 3, "partitions of auto-created topics")
		auto    = flag.Bool("auto-create", true, "auto-create topics on produce/metadata")
		sasl    = flag.String("sasl", "", "enable SASL with superuser MECH:USER:PASS (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
		tlsCert = flag.String("tls-cert", "", "serve TLS with this PEM certificate (needs -tls-key)")
		tlsKey  = flag.String("tls-key", "", "PEM private key for -tls-cert")
		noTxn   = flag.String("no-txn-user", "", "with -sasl: enable ACLs and add user MECH:USER:PASS allowed everything but transactional ids (its transactions are refused)")
		session = flag.Duration("group-session-timeout", 10*time.Second, "KIP-848 group session timeout (group.consumer.session.timeout.ms)")
		beat    = flag.Duration("group-heartbeat", 500*time.Millisecond, "KIP-848 group heartbeat interval (group.consumer.heartbeat.interval.ms; Kafka's default is 5s)")
	)
	flag.Parse()

	opts := []kfake.Opt{
		kfake.NumBrokers(*brokers),
		kfake.DefaultNumPartitions(*parts),
		// rtproxy's routes are KIP-848 groups on kfake: a killed member's
		// partitions move after this, as with rtproxy's classic default.
		kfake.BrokerConfigs(map[string]string{
			"group.consumer.session.timeout.ms":    strconv.FormatInt(session.Milliseconds(), 10),
			"group.consumer.heartbeat.interval.ms": strconv.FormatInt(beat.Milliseconds(), 10),
		}),
	}
	if *auto {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	if *ports != "" {
		var ps []int
		for _, p := range strings.Split(*ports, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil {
				log.Fatalf("bad -ports %q: %v", *ports, err)
			}
			ps = append(ps, n)
		}
		opts = append(opts, kfake.Ports(ps...))
	}
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir), kfake.SyncWrites())
	}
	if *sasl != "" {
		f := strings.SplitN(*sasl, ":", 3)
		if len(f) != 3 {
			log.Fatalf("bad -sasl %q: want MECH:USER:PASS", *sasl)
		}
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser(f[0], f[1], f[2]))
	}
	if *noTxn != "" {
		f := strings.SplitN(*noTxn, ":", 3)
		if len(f) != 3 || *sasl == "" {
			log.Fatalf("bad -no-txn-user %q: want MECH:USER:PASS, and -sasl", *noTxn)
		}
		var acls []kfake.ACL
		for _, rt := range []kmsg.ACLResourceType{kmsg.ACLResourceTypeTopic, kmsg.ACLResourceTypeGroup, kmsg.ACLResourceTypeCluster} {
			acls = append(acls, kfake.ACL{Resource: rt, Name: "*", Pattern: kmsg.ACLResourcePatternTypeLiteral,
				Operation: kmsg.ACLOperationAll, Allow: true})
		}
		opts = append(opts, kfake.EnableACLs(), kfake.User(f[0], f[1], f[2], acls...))
	}
	if *tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			log.Fatalf("bad -tls-cert/-tls-key: %v", err)
		}
		opts = append(opts, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}}))
	}
	// KFAKE_LOG=1 logs every group join, leave and eviction to stderr (the
	// integration harness prints it when a test fails).
	if os.Getenv("KFAKE_LOG") != "" {
		opts = append(opts, kfake.WithLogger(kfake.BasicLogger(os.Stderr, kfake.LogLevelInfo)))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		log.Fatalf("kfake: %v", err)
	}
	if *topics != "" {
		for _, t := range strings.Split(*topics, ",") {
			name, n, ok := strings.Cut(t, ":")
			np := int64(*parts)
			if ok {
				if np, err = strconv.ParseInt(n, 10, 32); err != nil {
					log.Fatalf("bad -topics entry %q: %v", t, err)
				}
			}
			if err := c.CreateTopic(name, int32(np), nil); err != nil && !strings.Contains(err.Error(), "exists") {
				log.Fatalf("create topic %s: %v", name, err)
			}
		}
	}
	fmt.Printf("ready %s\n", strings.Join(c.ListenAddrs(), ","))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	c.Close()
}
