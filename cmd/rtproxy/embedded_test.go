package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// metadataFor asks the cluster about topic with Metadata capped at maxVersion
// and allow_auto_topic_creation as given (only sent for v4+).
func metadataFor(t *testing.T, seeds []string, topic string, maxVersion int16, allowAuto bool) *kmsg.MetadataResponse {
	t.Helper()
	v := kversion.Stable()
	v.SetMaxKeyVersion(kmsg.Metadata.Int16(), maxVersion)
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.MaxVersions(v))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = allowAuto
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Version > maxVersion {
		t.Fatalf("asked for Metadata <= v%d, got v%d", maxVersion, resp.Version)
	}
	return resp
}

func TestEmbeddedAutoCreatesForOldMetadata(t *testing.T) {
	dir := t.TempDir()
	e, err := startEmbedded(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if len(e.addrs) != 3 {
		e.Close()
		t.Fatalf("%d brokers, want 3", len(e.addrs))
	}

	// v3 cannot say "allow auto-create"; Kafka then creates the topic.
	resp := metadataFor(t, e.addrs, "old-client-topic", 3, false)
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 || len(resp.Topics[0].Partitions) != 3 || len(resp.Brokers) != 3 {
		t.Fatalf("Metadata v3: %+v", resp)
	}
	// v4+ says it, and false is respected like a real broker.
	resp = metadataFor(t, e.addrs, "new-client-no-create", 9, false)
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 3 /* UNKNOWN_TOPIC_OR_PARTITION */ {
		t.Fatalf("Metadata v9 without auto-create: %+v", resp.Topics)
	}
	resp = metadataFor(t, e.addrs, "new-client-create", 9, true)
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 || len(resp.Topics[0].Partitions) != 3 {
		t.Fatalf("Metadata v9 with auto-create: %+v", resp.Topics)
	}

	// Data survives a restart on the same state dir (make run keeps topics).
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "old-client-topic", Value: []byte("kept")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	e.Close()
	if _, err := os.Stat(filepath.Join(dir, "embedded-broker")); err != nil {
		t.Fatalf("no data dir: %v", err)
	}
	e, err = startEmbedded(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cl, err = kgo.NewClient(kgo.SeedBrokers(e.addrs...), kgo.ConsumeTopics("old-client-topic"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fs := cl.PollFetches(ctx)
	if err := fs.Err0(); err != nil {
		t.Fatal(err)
	}
	recs := fs.Records()
	if len(recs) != 1 || string(recs[0].Value) != "kept" {
		t.Fatalf("after restart got %d records", len(recs))
	}
}
