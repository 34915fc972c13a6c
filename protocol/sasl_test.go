package protocol

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL from clients passes through: the brokers stay the authority.
func TestSASLPassThrough(t *testing.T) {
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256"} {
		t.Run(mech, func(t *testing.T) {
			upstream := startKfake(t, "-sasl", mech+":admin:s3cret", "-topics", "authed:1")
			// The proxy's own metadata connection is unauthenticated, so it
			// becomes Ready only from a client's Metadata response.
			tp := startProxyNoWait(t, upstream)
			mechFor := func(pass string) kgo.Opt {
				if mech == "PLAIN" {
					return kgo.SASL(plain.Auth{User: "admin", Pass: pass}.AsMechanism())
				}
				return kgo.SASL(scram.Auth{User: "admin", Pass: pass}.AsSha256Mechanism())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cl, err := kgo.NewClient(kgo.SeedBrokers(tp.Addr()), kgo.ProducerLinger(0), mechFor("s3cret"),
				kgo.ConsumeTopics("authed"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "authed", Value: []byte("hello " + mech)}).FirstErr(); err != nil {
				t.Fatalf("authenticated produce: %v", err)
			}
			var got string
			for got == "" && ctx.Err() == nil {
				cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = string(r.Value) })
			}
			if got != "hello "+mech {
				t.Fatalf("consumed %q", got)
			}
			if !tp.Ready() {
				t.Fatal("not Ready after client metadata passed through")
			}

			// A wrong password fails exactly as it does against the broker.
			pingErr := func(seeds ...string) error {
				bad, err := kgo.NewClient(kgo.SeedBrokers(seeds...), mechFor("wrong"), kgo.RequestRetries(0))
				if err != nil {
					t.Fatal(err)
				}
				defer bad.Close()
				bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer bcancel()
				return bad.Ping(bctx)
			}
			direct, proxied := pingErr(upstream[0]), pingErr(tp.Addr())
			if proxied == nil || direct == nil || proxied.Error() != direct.Error() {
				t.Fatalf("wrong password: through proxy %v, direct %v", proxied, direct)
			}
		})
	}
}
