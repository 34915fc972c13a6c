package pipeline

import (
	"strings"
	"testing"
	"time"
)

// testConfig gives c what rtproxy run sets from the proxy's config
// (config.Default holds those defaults; the pipeline keeps none and cannot
// import config): the values tests run with unless they set their own.
func testConfig(c Config) Config {
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.GroupProtocol == "" {
		c.GroupProtocol = "auto"
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 8 * time.Second
	}
	return c
}

// TestNewRequiresTheProxysSettings: the settings whose defaults config
// holds are required, never filled in here, and batch_window has one
// meaning of off, 0, as in config: a negative window is refused.
func TestNewRequiresTheProxysSettings(t *testing.T) {
	for name, c := range map[string]struct {
		mod  func(*Config)
		want string
	}{
		"session timeout": {func(c *Config) { c.SessionTimeout = 0 }, "session timeout 0s must be positive (group_session_timeout)"},
		"group protocol":  {func(c *Config) { c.GroupProtocol = "" }, `group protocol "" is not one of auto, consumer, classic`},
		"stop timeout":    {func(c *Config) { c.StopTimeout = 0 }, "stop timeout 0s must be positive (shutdown_grace)"},
		"batch window":    {func(c *Config) { c.BatchWindow = -time.Millisecond }, "batch window -1ms is negative; 0 is off"},
	} {
		cfg := testConfig(Config{Seeds: []string{"127.0.0.1:1"}, StateDir: t.TempDir()})
		c.mod(&cfg)
		m, err := New(cfg)
		if err == nil {
			m.closeState()
			t.Errorf("%s: accepted (a default was filled in)", name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
	// 0 is off: no linger, no pacing.
	m, err := New(testConfig(Config{Seeds: []string{"127.0.0.1:1"}, StateDir: t.TempDir()}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.closeState()
	r := &route{m: m}
	if r.writeLinger() != 0 {
		t.Errorf("batch_window 0: linger %v, want none", r.writeLinger())
	}
	m.cfg.BatchWindow = 5 * time.Millisecond
	if r.writeLinger() != produceLinger {
		t.Errorf("batch_window 5ms: linger %v, want %v", r.writeLinger(), produceLinger)
	}
}
