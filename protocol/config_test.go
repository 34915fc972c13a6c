package protocol

import (
	"strings"
	"testing"
	"time"
)

// TestNewRequiresEveryValue: the proxy keeps no defaults of its own
// (config.Default holds them): a Config without a value it needs is
// refused, naming the value, instead of being filled in here.
func TestNewRequiresEveryValue(t *testing.T) {
	full := func() Config {
		return Config{Listen: "127.0.0.1:0", AdvertiseHost: "127.0.0.1", BrokerPortFirst: randomPortFirst(),
			BrokerPortCount: 10, Upstream: []string{"127.0.0.1:1"}, MaxFrameBytes: 1 << 20, ShutdownGrace: time.Second,
			MaxDecodedBytes: 1 << 20, MaxRecordsPerRequest: 1000, MaxDecodedBytesTotal: 4 << 20}
	}
	p, err := New(full())
	if err != nil {
		t.Fatalf("a complete config: %v", err)
	}
	p.bootstrap.Close()
	for name, c := range map[string]struct {
		mod  func(*Config)
		want string
	}{
		"advertise host": {func(c *Config) { c.AdvertiseHost = "" }, "AdvertiseHost is required"},
		"port first":     {func(c *Config) { c.BrokerPortFirst = 0 }, "broker port range"},
		"port count":     {func(c *Config) { c.BrokerPortCount = 0 }, "broker port range"},
		"max frame":      {func(c *Config) { c.MaxFrameBytes = 0 }, "MaxFrameBytes 0 is too small"},
		"grace":          {func(c *Config) { c.ShutdownGrace = 0 }, "ShutdownGrace 0s must be positive"},
		"listen":         {func(c *Config) { c.Listen = "" }, "Listen is required"},
		"decoded bytes":  {func(c *Config) { c.MaxDecodedBytes = 0 }, "decode budgets"},
		"records":        {func(c *Config) { c.MaxRecordsPerRequest = 0 }, "decode budgets"},
		"decoded total":  {func(c *Config) { c.MaxDecodedBytesTotal = 0 }, "decode budgets"},
	} {
		cfg := full()
		c.mod(&cfg)
		p, err := New(cfg)
		if err == nil {
			p.bootstrap.Close()
			t.Errorf("%s: accepted (a default was filled in)", name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}
