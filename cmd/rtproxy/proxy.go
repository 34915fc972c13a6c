package main

import (
	"context"
	"crypto/tls"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/rtproxy/rtproxy/config"
	"github.com/rtproxy/rtproxy/protocol"
)

// proxyWithClient is the proxy plus the franz-go client it reads metadata
// with when the brokers require SASL; the client closes when the proxy stops.
type proxyWithClient struct {
	*protocol.Proxy
	cl *kgo.Client
}

func (p *proxyWithClient) Run(ctx context.Context) error {
	defer p.cl.Close()
	return p.Proxy.Run(ctx)
}

// newProxy is the adapter to protocol/: the Kafka listeners and the
// connection pairs behind them. ownOpts are the proxy's own client options
// (upstream TLS and SASL, as the pipelines use).
func newProxy(cfg *config.Config, upstream []string, clientTLS, upstreamTLS *tls.Config, ownOpts []kgo.Opt, log *slog.Logger, reg prometheus.Registerer) (proxyServer, error) {
	pc := protocol.Config{
		Listen:               cfg.Listen,
		AdvertiseHost:        cfg.AdvertiseHost,
		BrokerPortFirst:      cfg.BrokerPorts,
		BrokerPortCount:      cfg.BrokerPortCount,
		Upstream:             upstream,
		MaxFrameBytes:        int32(cfg.MaxFrameBytes), // Validate caps it at MaxInt32
		ClientTLS:            clientTLS,
		UpstreamTLS:          proxiedTLS(upstreamTLS, cfg.TLS.Upstream.ForwardIdentity),
		ShutdownGrace:        cfg.ShutdownGrace,
		MaxConnections:       cfg.Proxy.MaxConnections,
		MaxHeldBytes:         cfg.Proxy.MaxHeldBytes,
		MaxDecodedBytes:      cfg.Proxy.MaxDecodedBytes,
		MaxRecordsPerRequest: cfg.Proxy.MaxRecordsPerRequest,
		MaxDecodedBytesTotal: cfg.Proxy.MaxDecodedBytesTotal,
		ClientIdleTimeout:    cfg.Proxy.ClientIdleTimeout,
		RequestReadTimeout:   cfg.Proxy.RequestReadTimeout,
		Logger:               log,
		Registerer:           reg,
	}
	ownCert := upstreamTLS != nil && len(upstreamTLS.Certificates) > 0
	if cfg.SASL.Mechanism == "" && (!ownCert || cfg.TLS.Upstream.ForwardIdentity) {
		return protocol.New(pc)
	}
	// Brokers that require SASL (or a client certificate the proxied
	// connections do not present) close an unauthenticated connection, and
	// the proxy's own metadata reads (readiness, listeners for new brokers)
	// would never succeed: they go through a client with the proxy's
	// identity instead.
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(upstream...), kgo.ClientID("rtproxy")}, ownOpts...)...)
	if err != nil {
		return nil, err
	}
	pc.FetchMetadata = func(ctx context.Context) (*kmsg.MetadataResponse, error) {
		req := kmsg.NewPtrMetadataRequest()
		req.Topics = nil // all topics: the proxy learns every topic id
		return req.RequestWith(ctx, cl)
	}
	px, err := protocol.New(pc)
	if err != nil {
		cl.Close()
		return nil, err
	}
	return &proxyWithClient{Proxy: px, cl: cl}, nil
}

// proxiedTLS is the TLS config of the connections the proxy opens for its
// clients: the upstream TLS settings without the proxy's own client
// certificate, unless tls.upstream.forward_identity says to present it. A
// client certificate is the proxy's broker identity (its ACLs); handing it
// to every client that reaches the listener is an explicit choice.
func proxiedTLS(upstream *tls.Config, forward bool) *tls.Config {
	if upstream == nil || forward || len(upstream.Certificates) == 0 {
		return upstream
	}
	c := upstream.Clone()
	c.Certificates = nil
	c.GetClientCertificate = nil
	return c
}
