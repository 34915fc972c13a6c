package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
)

// cmdDemo holds helpers for the quickstart; today one: demo produce.
func cmdDemo(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "produce" {
		fmt.Fprintln(stderr, "usage: rtproxy demo produce [--bootstrap ADDR] [--topic T] [--rate N] [--count N] [--format json|avro] [--registry URL]")
		return 2
	}
	fs := flag.NewFlagSet("rtproxy demo produce", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bootstrap := fs.String("bootstrap", "127.0.0.1:9092", "Kafka bootstrap address (the proxy)")
	topic := fs.String("topic", "payments", "topic to produce to (auto-created by the embedded broker)")
	rate := fs.Int("rate", 100, "records per second; 0 produces as fast as the broker acknowledges")
	count := fs.Int("count", 1000, "records to produce; 0 runs until interrupted")
	seed := fs.Uint64("seed", 0, "random seed; 0 picks one, the same seed gives the same records")
	format := fs.String("format", "json", "json, or avro: the schema registered under <topic>-value in --registry, records in the Confluent wire format")
	registry := fs.String("registry", "http://127.0.0.1:9644"+embeddedRegistryPath, "schema registry for --format avro (default: the embedded one of `rtproxy run` without upstream)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *rate < 0 || *count < 0 || *topic == "" || (*format != "json" && *format != "avro") {
		fmt.Fprintln(stderr, "rtproxy demo produce: --rate and --count must be >= 0, --topic non-empty, --format json or avro")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	enc := func(p payment) ([]byte, error) { return json.Marshal(p) }
	if *format == "avro" {
		var err error
		if enc, err = demoAvro(ctx, *registry, *topic+"-value"); err != nil {
			fmt.Fprintf(stderr, "rtproxy demo produce: %v\n", err)
			return 1
		}
	}
	n, err := demoProduce(ctx, strings.Split(*bootstrap, ","), *topic, *rate, *count, *seed, enc)
	fmt.Fprintf(stdout, "produced %d records to %s\n", n, *topic)
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "rtproxy demo produce: %v\n", err)
		return 1
	}
	return 0
}

// payment is the sample record: a card payment as a payments service would
// publish it. ts is epoch milliseconds, usable as a route's event_time.
type payment struct {
	TxnID      string  `json:"txn_id"`
	UserID     string  `json:"user_id"`
	MerchantID string  `json:"merchant_id"`
	Amount     float64 `json:"amount"`
	Status     string  `json:"status"`
	TS         int64   `json:"ts"`
}

// samplePayment makes record i, shaped for examples/quickstart's
// payments-risk route: merchants m1-m3 are in its merchants table and m4 is
// not (a join miss); 20 users, so windows per user fill up. About one in
// twenty is a "test" payment and one in ten "declined", so filters have
// something to do; one in fifty repeats the previous txn_id, for
// drop_duplicates.
func samplePayment(r *rand.Rand, i int, now time.Time) payment {
	id := i
	if i > 0 && r.IntN(50) == 0 {
		id = i - 1
	}
	status := "ok"
	switch x := r.IntN(20); {
	case x == 0:
		status = "test"
	case x <= 2:
		status = "declined"
	}
	return payment{
		TxnID:      fmt.Sprintf("txn-%08d", id),
		UserID:     fmt.Sprintf("u%d", r.IntN(20)+1),
		MerchantID: fmt.Sprintf("m%d", r.IntN(4)+1),
		Amount:     float64(r.IntN(50000)+100) / 100,
		Status:     status,
		TS:         now.UnixMilli(),
	}
}

// demoPaymentAvsc is the Avro schema of payment.
const demoPaymentAvsc = `{"type": "record", "name": "Payment", "namespace": "rtproxy.demo", "fields": [
  {"name": "txn_id", "type": "string"},
  {"name": "user_id", "type": "string"},
  {"name": "merchant_id", "type": "string"},
  {"name": "amount", "type": "double"},
  {"name": "status", "type": "string"},
  {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}`

// demoAvro registers demoPaymentAvsc under subject and returns the
// encoder of payments in the Confluent wire format (franz-go's sr.Serde,
// hamba/avro).
func demoAvro(ctx context.Context, registry, subject string) (func(payment) ([]byte, error), error) {
	cl, err := sr.NewClient(sr.URLs(registry))
	if err != nil {
		return nil, err
	}
	ss, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: demoPaymentAvsc, Type: sr.TypeAvro})
	if err != nil {
		return nil, fmt.Errorf("registering the payment schema in %s: %w", registry, err)
	}
	sch := avro.MustParse(demoPaymentAvsc)
	var s sr.Serde
	s.Register(ss.ID, demoAvroPayment{}, sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(sch, v) }))
	return func(p payment) ([]byte, error) {
		return s.Encode(demoAvroPayment{p.TxnID, p.UserID, p.MerchantID, p.Amount, p.Status, p.TS})
	}, nil
}

type demoAvroPayment struct {
	TxnID      string  `avro:"txn_id"`
	UserID     string  `avro:"user_id"`
	MerchantID string  `avro:"merchant_id"`
	Amount     float64 `avro:"amount"`
	Status     string  `avro:"status"`
	TS         int64   `avro:"ts"`
}

func demoProduce(ctx context.Context, seeds []string, topic string, rate, count int, seed uint64, enc func(payment) ([]byte, error)) (int, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.DefaultProduceTopic(topic),
		kgo.AllowAutoTopicCreation(),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(30*time.Second),
	)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	r := rand.New(rand.NewPCG(seed, seed>>1|1))

	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		tick = t.C
	}
	var (
		mu       sync.Mutex
		acked    int
		firstErr error
		wg       sync.WaitGroup
	)
	for i := 0; count == 0 || i < count; i++ {
		if tick != nil {
			select {
			case <-tick:
			case <-ctx.Done():
				wg.Wait()
				return acked, ctx.Err()
			}
		} else if ctx.Err() != nil {
			break
		}
		p := samplePayment(r, i, time.Now())
		v, err := enc(p)
		if err != nil {
			wg.Wait()
			return acked, err
		}
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Key: []byte(p.UserID), Value: v}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			acked++
		})
		mu.Lock()
		failed := firstErr
		mu.Unlock()
		if failed != nil {
			break
		}
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return acked, firstErr
}
