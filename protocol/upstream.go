package protocol

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// The proxy reads cluster metadata on its own connection at start and
// every metadataRefresh, so that every broker has a listener before any
// client is told about it and Ready reports true once the upstream is
// known. Client Metadata responses passing through update the same map.

const proxyClientID = "rtproxy"

// metadataVersionCap is the highest Metadata version the refresher asks
// for: v10+ carries topic ids.
const metadataVersionCap = 12

func (p *Proxy) refreshLoop() {
	defer p.loops.Done()
	retry := metadataRetry
	failing := false
	for {
		wait := metadataRefresh
		if err := p.refreshMetadata(); err != nil {
			// Warn once per failure streak, then back off: an upstream
			// that requires SASL refuses this connection for good, and
			// client traffic (which authenticates itself) still works.
			lvl := slog.LevelDebug
			if !failing {
				lvl = slog.LevelWarn
			}
			p.log.Log(p.stopCtx, lvl, "upstream metadata fetch failed; retrying", "err", err, "retry_in", retry)
			failing = true
			wait = retry
			retry = min(retry*2, metadataRefresh)
		} else {
			if failing {
				p.log.Info("upstream metadata fetch recovered")
			}
			failing, retry = false, metadataRetry
		}
		select {
		case <-p.stopCtx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (p *Proxy) refreshMetadata() error {
	var (
		resp   *kmsg.MetadataResponse
		target = "upstream"
		err    error
	)
	if p.cfg.FetchMetadata != nil {
		ctx, cancel := context.WithTimeout(p.stopCtx, 10*time.Second)
		resp, err = p.cfg.FetchMetadata(ctx)
		cancel()
		if err != nil {
			return fmt.Errorf("Metadata: %w", err)
		}
	} else if resp, target, err = p.dialMetadata(); err != nil {
		return err
	}
	if len(resp.Brokers) == 0 {
		return fmt.Errorf("%s: Metadata listed no brokers", target)
	}
	for _, b := range resp.Brokers {
		if _, _, err := p.MapBroker(b.NodeID, b.Host, b.Port); err != nil {
			return err
		}
	}
	var zero [16]byte
	for _, t := range resp.Topics {
		if t.Topic != nil && t.TopicID != zero {
			p.LearnTopic(t.TopicID, *t.Topic)
		}
	}
	p.markReady("proxy metadata refresh")
	return nil
}

// markReady records that upstream metadata has been seen, from the
// proxy's own refresh or from a client's Metadata response.
func (p *Proxy) markReady(source string) {
	if !p.ready.Swap(true) {
		p.log.Info("upstream metadata fetched; proxy ready", "source", source)
	}
}

// dialMetadata reads metadata on a connection of the proxy's own to a seed.
func (p *Proxy) dialMetadata() (*kmsg.MetadataResponse, string, error) {
	c, target, err := p.dialFor(-1)
	if err != nil {
		return nil, target, fmt.Errorf("dial %s: %w", target, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))

	av := kmsg.NewPtrApiVersionsRequest()
	av.SetVersion(0)
	r, err := roundTrip(c, av, 1, p.cfg.MaxFrameBytes)
	if err != nil {
		return nil, target, fmt.Errorf("%s: ApiVersions: %w", target, err)
	}
	version := int16(-1)
	for _, k := range r.(*kmsg.ApiVersionsResponse).ApiKeys {
		if k.ApiKey == int16(kmsg.Metadata) {
			version = min(k.MaxVersion, metadataVersionCap)
		}
	}
	if version < 1 {
		return nil, target, fmt.Errorf("%s: broker does not support Metadata v1+", target)
	}
	md := kmsg.NewPtrMetadataRequest()
	md.SetVersion(version)
	md.Topics = nil // all topics
	r, err = roundTrip(c, md, 2, p.cfg.MaxFrameBytes)
	if err != nil {
		return nil, target, fmt.Errorf("%s: Metadata: %w", target, err)
	}
	return r.(*kmsg.MetadataResponse), target, nil
}

// roundTrip writes req with a v1/v2 request header and reads its response.
func roundTrip(c net.Conn, req kmsg.Request, corr int32, maxBytes int32) (kmsg.Response, error) {
	buf := make([]byte, 4, 64)
	buf = binary.BigEndian.AppendUint16(buf, uint16(req.Key()))
	buf = binary.BigEndian.AppendUint16(buf, uint16(req.GetVersion()))
	buf = binary.BigEndian.AppendUint32(buf, uint32(corr))
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(proxyClientID)))
	buf = append(buf, proxyClientID...)
	if req.IsFlexible() {
		buf = append(buf, 0) // no header tags
	}
	buf = req.AppendTo(buf)
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	if _, err := c.Write(buf); err != nil {
		return nil, err
	}
	var size [4]byte
	frame, err := ReadFrame(c, &size, maxBytes, false)
	if err != nil {
		return nil, err
	}
	defer ReleaseFrame(frame)
	if got := int32(binary.BigEndian.Uint32(frame[4:])); got != corr {
		return nil, fmt.Errorf("correlation id %d, want %d", got, corr)
	}
	off, err := responseBodyOffset(frame[4:], req.Key(), req.GetVersion())
	if err != nil {
		return nil, err
	}
	resp := req.ResponseKind()
	if err := resp.ReadFrom(frame[4+off:]); err != nil {
		return nil, errors.Join(errors.New("decode response"), err)
	}
	return resp, nil
}
