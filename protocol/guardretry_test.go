package protocol

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// retryGuards cannot check a record whose value contains "later" while
// down is set (a schema registry that does not answer); "bad" fails.
type retryGuards struct {
	testGuards
	down    atomic.Bool
	checked atomic.Int64
}

func (g *retryGuards) For(topic string) Guard {
	if topic == "guarded" {
		return g
	}
	return nil
}

func (g *retryGuards) CheckRetriable(topic string, p int32, r *ProducedRecord) (string, string, bool, bool) {
	g.checked.Add(1)
	if bytes.Contains(r.Value, []byte("later")) && g.down.Load() {
		return "decode", "schema registry unavailable", false, true
	}
	c, m, ok := g.testGuards.Check(topic, p, r)
	return c, m, ok, false
}

// A record a guard cannot check now refuses its partition with
// REQUEST_TIMED_OUT, which producers retry (a non-idempotent client with
// one retry gives up; an idempotent franz-go retries until it passes), and once
// the guard can check again the record goes through. Nothing after it in
// the partition is checked, and the refusal is not a record error.
func TestGuardRetriableRefusal(t *testing.T) {
	upstream := startKfake(t, "-topics", "guarded:1")
	tp := startProxy(t, upstream, nil)
	gs := &retryGuards{}
	gs.down.Store(true)
	tp.SetGuards(gs)
	cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0), kgo.RecordRetries(1), kgo.DisableIdempotentWrite(),
		kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = cl.ProduceSync(ctx, &kgo.Record{Topic: "guarded", Value: []byte("later-1")}).FirstErr()
	// franz-go retried the retriable error once, then gave up.
	if err == nil || errors.Is(err, kerr.InvalidRecord) || !strings.Contains(err.Error(), "retried too many times") {
		t.Fatalf("produce while the guard cannot check: %v, want a retried (REQUEST_TIMED_OUT) failure", err)
	}
	gs.mu.Lock()
	n := len(gs.refused)
	var retriable bool
	if n > 0 {
		retriable = gs.refused[n-1].Retriable()
	}
	gs.mu.Unlock()
	if n < 2 || !retriable {
		t.Errorf("%d refusals, last retriable %v; want a retriable refusal", n, retriable)
	}

	// Retried until the guard can check: franz-go's default retries.
	cl2, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0),
		kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }))
	if err != nil {
		t.Fatal(err)
	}
	defer cl2.Close()
	go func() {
		time.Sleep(300 * time.Millisecond)
		gs.down.Store(false)
	}()
	if err := cl2.ProduceSync(ctx, &kgo.Record{Topic: "guarded", Value: []byte("later-2")}).FirstErr(); err != nil {
		t.Errorf("produce retried until the guard can check: %v", err)
	}
	// A permanent failure before the retriable one stays INVALID_RECORD.
	gs.down.Store(true)
	err = cl.ProduceSync(ctx, &kgo.Record{Topic: "guarded", Value: []byte("bad")}, &kgo.Record{Topic: "guarded", Value: []byte("later-3")}).FirstErr()
	if !errors.Is(err, kerr.InvalidRecord) {
		t.Errorf("bad then uncheckable: %v, want INVALID_RECORD", err)
	}
}

// The answer of a retriable refusal: REQUEST_TIMED_OUT, no record errors
// (the records are not bad), a message that says to retry.
func TestRefusedOfRetriable(t *testing.T) {
	rf := &Refusal{Topic: "t", Partition: 3, Failures: []RecordFailure{{Index: 2, Check: "g/decode", Message: "registry down", Retry: true}}}
	rp := refusedOf("t", [16]byte{}, rf)
	if rp.code != kerr.RequestTimedOut.Code || len(rp.records) != 0 || !strings.Contains(rp.message, "cannot be checked now") {
		t.Errorf("retriable refusal answered %+v", rp)
	}
	rf.Failures = append([]RecordFailure{{Index: 0, Check: "g/positive", Message: "no"}}, rf.Failures...)
	if rp := refusedOf("t", [16]byte{}, rf); rp.code != kerr.InvalidRecord.Code {
		t.Errorf("a failed check with it: code %d, want INVALID_RECORD", rp.code)
	}
}
