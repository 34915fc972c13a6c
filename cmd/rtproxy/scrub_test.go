package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestBinaryErrorTextHidesRecordValues is finding 12 through the binary:
// with admin.show_records off (the default), a step whose expression fails
// on a record's value puts the failure on the route's status page and
// /routes without the value; the dead-letter record itself keeps the full
// text (it is data).
func TestBinaryErrorTextHidesRecordValues(t *testing.T) {
	const card = "4111-1111-1111-1111 CVV 123"
	rulesDir := t.TempDir()
	rule := "route: cards\nsource: { topic: cards, start: earliest }\nsink: { topic: cards.out }\nsteps:\n  - set: { n: int(value.card) }\n"
	if err := os.WriteFile(filepath.Join(rulesDir, "cards.yaml"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startRun(t, rulesDir)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.listen), kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeTopics("cards.dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "cards", Key: []byte("c1"), Value: []byte(`{"card":"` + card + `"}`)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// The dead letter holds the full error: the DL topic is data.
	var dlErr string
	for dlErr == "" {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no dead letter within 45s")
		}
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "rtproxy-error" {
					dlErr = string(h.Value)
				}
			}
		})
	}
	if !strings.Contains(dlErr, card) {
		t.Errorf("the dead letter's rtproxy-error lost the full text: %q", dlErr)
	}
	var page, routes string
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, page, _ = httpGet(p.admin + "/route/cards")
		_, routes, _ = httpGet(p.admin + "/routes")
		if strings.Contains(page, "invalid operation: int(") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, secret := range []string{"4111", "CVV 123"} {
		if strings.Contains(page, secret) {
			t.Errorf("/route/cards shows %q with admin.show_records off", secret)
		}
		if strings.Contains(routes, secret) {
			t.Errorf("/routes shows %q with admin.show_records off", secret)
		}
		if strings.Contains(p.Logs(), secret) {
			t.Errorf("the logs show %q", secret)
		}
	}
	if !strings.Contains(page, "invalid operation: int(‹hidden›)") || !strings.Contains(page, "record values hidden") {
		t.Errorf("/route/cards does not show the failure without its value:\n%s", page)
	}
	cl.Close()
	p.stop(t)
}
