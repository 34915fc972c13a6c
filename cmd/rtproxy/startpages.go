package main

import (
	"context"
	"log/slog"
	"time"
)

// startupSettle is how long after startup (the proxy ready, no route
// starting) the startup pages are released: the routes' first partitions
// and checkpoints come meanwhile.
const startupSettle = 10 * time.Second

// releaseAfterStart waits for ready (polled during startup only, at most
// two minutes) and startupSettle, then releases the executable's startup
// pages (releaseStartupPages), once.
func releaseAfterStart(ctx context.Context, ready func() bool, log *slog.Logger) {
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for give := time.Now().Add(2 * time.Minute); !ready() && time.Now().Before(give); {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		}
	}
	poll.Stop()
	select {
	case <-ctx.Done():
		return
	case <-time.After(startupSettle):
	}
	n, err := releaseStartupPages()
	if err != nil {
		log.Debug("startup pages not released", "err", err)
		return
	}
	log.Debug("startup pages released", "bytes", n)
}
