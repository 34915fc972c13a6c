package main

import (
	"crypto/tls"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/protocol"
)

// newProxy is the adapter to protocol/: the Kafka listeners and the
// connection pairs behind them.
func newProxy(cfg *config.Config, upstream []string, clientTLS, upstreamTLS *tls.Config, log *slog.Logger, reg prometheus.Registerer) (proxyServer, error) {
	return protocol.New(protocol.Config{
		Listen:          cfg.Listen,
		AdvertiseHost:   cfg.AdvertiseHost,
		BrokerPortFirst: cfg.BrokerPorts,
		BrokerPortCount: cfg.BrokerPortCount,
		Upstream:        upstream,
		MaxFrameBytes:   int32(cfg.MaxFrameBytes), // Validate caps it at MaxInt32
		ClientTLS:       clientTLS,
		UpstreamTLS:     upstreamTLS,
		ShutdownGrace:   cfg.ShutdownGrace,
		Logger:          log,
		Registerer:      reg,
	})
}
