package pipeline

// The instance's one non-group client, shared by every route: admin
// requests (topics, offsets, configs, the owners' describe), metadata, and
// the changelog and journal records of at-least-once and exactly-once
// routes alike. Each route used to open its own, and a throwaway one for
// every setup attempt: three kgo clients per route, each with its
// metadata, reaper and metrics loops, its connections and buffers
// (docs/BENCHMARKS.md, "Footprint"). Only the group consumers stay per
// route (each route is its own group, and an exactly-once route's
// transactional producer is its group client). What stays per route is
// what must: the outbox (writer.go), the retry queues (produce.go) and the
// transaction.

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// sharedClient is created by the first route that needs it and closed
// when the Manager's Run ends, after every route has stopped.
type sharedClient struct {
	mu     sync.Mutex
	cl     *kgo.Client
	adm    *kadm.Client
	closed bool
	// limits is max.message.bytes of every topic a route's setup read,
	// for the producer's batch limit (batchLimits). A topic's limit is the
	// same whichever route read it.
	limits struct {
		sync.RWMutex
		by topicLimits
	}
}

// get returns the shared client, creating it with base (the seeds and
// the configured client options) the first time.
func (s *sharedClient) get(base []kgo.Opt) (*kgo.Client, *kadm.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errStopping
	}
	if s.cl != nil {
		return s.cl, s.adm, nil
	}
	// Its goroutines are the instance's, not the route whose setup
	// happened to create it (pprof labels, cost.go): made in a goroutine
	// of its own, so the caller's labels stay as they are.
	var cl *kgo.Client
	var err error
	made := make(chan struct{})
	go func() {
		defer close(made)
		pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("pipeline", "shared")))
		cl, err = s.newClient(base)
	}()
	<-made
	if err != nil {
		return nil, nil, fmt.Errorf("client: %w", err)
	}
	s.cl, s.adm = cl, kadm.NewClient(cl)
	return s.cl, s.adm, nil
}

func (s *sharedClient) newClient(base []kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append(append([]kgo.Opt(nil), base...),
		// Changelog records name their partition (the task's).
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytesFn(s.limitOf),
		kgo.ProducerLinger(0),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// A changelog write that cannot be delivered fails its checkpoint
		// in bounded time (retried by the next), and never holds the
		// buffer the other routes' changelogs share for longer.
		kgo.RecordDeliveryTimeout(10*time.Second),
	)...)
}

// addLimits notes topics' max.message.bytes.
func (s *sharedClient) addLimits(l topicLimits) {
	s.limits.Lock()
	defer s.limits.Unlock()
	if s.limits.by == nil {
		s.limits.by = topicLimits{}
	}
	for t, v := range l {
		s.limits.by[t] = v
	}
}

func (s *sharedClient) limitOf(topic string) int32 {
	s.limits.RLock()
	defer s.limits.RUnlock()
	return s.limits.by.of(topic)
}

func (s *sharedClient) close() {
	s.mu.Lock()
	cl := s.cl
	s.cl, s.adm, s.closed = nil, nil, true
	s.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
}
