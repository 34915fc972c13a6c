package integration

// SASL from clients is forwarded through the proxy; the brokers stay the
// authority. kfake runs with SASL enabled and a superuser; clients
// authenticate through the proxy, and a wrong password must be refused by
// the broker, not let through.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

func TestSASLPassThrough(t *testing.T) {
	const user, pass = "admin", "s3cret"
	cases := []struct {
		mech      string
		mechanism func(user, pass string) sasl.Mechanism
	}{
		{"PLAIN", func(u, p string) sasl.Mechanism { return plain.Auth{User: u, Pass: p}.AsMechanism() }},
		{"SCRAM-SHA-256", func(u, p string) sasl.Mechanism { return scram.Auth{User: u, Pass: p}.AsSha256Mechanism() }},
	}
	for _, tc := range cases {
		t.Run(tc.mech, func(t *testing.T) {
			topic := "sasl-" + strings.ToLower(tc.mech)
			// The proxy needs its own upstream identity to fetch metadata for
			// readiness; clients still bring and forward their own.
			s := StartStack(t, KfakeOpts{SASL: tc.mech + ":" + user + ":" + pass, Topics: map[string]int{topic: 3}}, ProxyOpts{
				Env: []string{"RTPROXY_SASL_MECHANISM=" + tc.mech, "RTPROXY_SASL_USERNAME=" + user, "RTPROXY_SASL_PASSWORD=" + pass},
			})

			cl := NewClient(t, s.Bootstrap, kgo.SASL(tc.mechanism(user, pass)), kgo.ProducerBatchCompression(kgo.NoCompression()))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			rs := MakeRecords(topic, "sasl", 25)
			if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
				t.Fatalf("produce with %s through the proxy: %v", tc.mech, err)
			}
			got := Consume(t, s.Bootstrap, topic, 25, 20*time.Second, kgo.SASL(tc.mechanism(user, pass)))
			AssertSameSet(t, "records produced and consumed with "+tc.mech, Values(got), Values(rs))
			s.AssertOnlyProxyAddrs(t, MetadataBrokers(t, cl))
			s.AssertProxyCarried(t, kmsg.SASLHandshake, kmsg.SASLAuthenticate, kmsg.Produce, kmsg.Fetch)

			// The broker decides: with a wrong password nothing is produced.
			// (kfake answers a failed authentication by closing the
			// connection, so the client's error is not always SASL-worded.)
			bad := NewClient(t, s.Bootstrap, kgo.SASL(tc.mechanism(user, "wrong")), kgo.RecordDeliveryTimeout(3*time.Second))
			bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer bcancel()
			err := bad.ProduceSync(bctx, &kgo.Record{Topic: topic, Value: []byte("intruder")}).FirstErr()
			if err == nil {
				t.Fatalf("a wrong %s password was accepted through the proxy", tc.mech)
			}
			bad.Close()
			after := ConsumeQuiet(t, s.Bootstrap, topic, 25, time.Second, 20*time.Second, kgo.SASL(tc.mechanism(user, pass)))
			AssertSameSet(t, "records after the refused client", Values(after), Values(rs))
			t.Logf("wrong %s password refused: %v", tc.mech, err)
		})
	}
}
