package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// embeddedBrokers is the in-process development cluster started when no
// upstream is configured: three kfake brokers whose data lives under
// state_dir/embedded-broker, so `make run` keeps topics across restarts.
type embeddedBrokers struct {
	cluster *kfake.Cluster
	addrs   []string
}

func startEmbedded(stateDir string, log *slog.Logger) (*embeddedBrokers, error) {
	dir := filepath.Join(stateDir, "embedded-broker")
	c, err := kfake.NewCluster(
		kfake.NumBrokers(3),
		kfake.DefaultNumPartitions(3),
		kfake.AllowAutoTopicCreation(),
		kfake.DataDir(dir),
		// Routes are KIP-848 groups here: a stopped instance's partitions
		// move after 10s, as with the classic protocol's default in rtproxy.
		kfake.BrokerConfigs(map[string]string{
			"group.consumer.session.timeout.ms":    "10000",
			"group.consumer.heartbeat.interval.ms": "500",
		}),
		kfake.WithLogger(kfakeLogger{log.With("component", "embedded-broker")}),
	)
	if err != nil {
		return nil, fmt.Errorf("embedded broker (data in %s): %w", dir, err)
	}
	// Metadata v0-v3 has no allow_auto_topic_creation field: a Kafka broker
	// with auto-create on creates requested topics for those versions, but
	// kfake reads the missing field as false. Setting it here, before kfake
	// handles the request, gives old clients (kcat with some librdkafka
	// builds, kafka-python) Kafka's behaviour. Returning false leaves the
	// answer to kfake and keeps this control installed for the next request.
	c.ControlKey(kmsg.Metadata.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		if req, ok := r.(*kmsg.MetadataRequest); ok && req.Version < 4 {
			req.AllowAutoTopicCreation = true
		}
		return nil, nil, false
	})
	e := &embeddedBrokers{cluster: c, addrs: c.ListenAddrs()}
	log.Warn("EMBEDDED DEVELOPMENT BROKER: no upstream is configured, so rtproxy runs an in-process 3-broker kfake cluster. "+
		"It is for development only: no replication, no security, not tuned. Set upstream (--upstream, RTPROXY_UPSTREAM) for real brokers.",
		"brokers", e.addrs, "data_dir", dir)
	return e, nil
}

func (e *embeddedBrokers) Close() { e.cluster.Close() }

// kfakeLogger sends kfake's logs to slog. kfake logs every request at info,
// which is debug for us.
type kfakeLogger struct{ log *slog.Logger }

func (l kfakeLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	lv := slog.LevelDebug
	switch level {
	case kfake.LogLevelError:
		lv = slog.LevelError
	case kfake.LogLevelWarn:
		lv = slog.LevelWarn
	}
	if !l.log.Enabled(context.Background(), lv) {
		return
	}
	l.log.Log(context.Background(), lv, fmt.Sprintf(format, args...))
}
