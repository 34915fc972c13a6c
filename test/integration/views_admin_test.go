package integration

// Views and the admin side, through the rtproxy binary: kcat -L lists a
// virtual topic with the real one's partitions; franz-go's kadm describes
// its configs and lists its offsets (the real topic's); deleting it is
// refused and the real topic stays. And one client that consumes a topic
// and its view at once (kcat's balanced consumer, librdkafka: one fetch
// names both) gets the originals under the real name and the view's
// records under the view's.

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestViewsAdminThroughBinary(t *testing.T) {
	k := StartKfake(t, KfakeOpts{Topics: map[string]int{"vpay": 3}})
	rules := t.TempDir()
	WriteRuleFile(t, rules, "vpay-analytics.yaml", viewFile)
	p := StartProxy(t, ProxyOpts{Upstream: k.Addrs, RulesDir: rules})
	viewsInForce(t, p.Addr)
	at, kept := produceViewInput(t, k.Addrs, 0, 60)

	t.Run("kcat -L", func(t *testing.T) {
		RequireTool(t, "kcat")
		var md struct {
			Topics []struct {
				Topic      string            `json:"topic"`
				Partitions []json.RawMessage `json:"partitions"`
				Err        any               `json:"error"`
			} `json:"topics"`
		}
		for _, args := range [][]string{{"-L", "-J", "-b", p.Addr}, {"-L", "-J", "-b", p.Addr, "-t", "vpay.analytics"}} {
			out := runClient(t, "", 30*time.Second, "kcat", args...)
			if err := json.Unmarshal(out, &md); err != nil {
				t.Fatalf("kcat %v: %v\n%s", args, err, out)
			}
			parts := map[string]int{}
			for _, tp := range md.Topics {
				if tp.Err != nil {
					t.Errorf("kcat %v: %s: error %v", args, tp.Topic, tp.Err)
				}
				parts[tp.Topic] = len(tp.Partitions)
			}
			if parts["vpay.analytics"] != 3 {
				t.Errorf("kcat %v lists %v, want vpay.analytics with 3 partitions", args, parts)
			}
		}
	})

	t.Run("kadm", func(t *testing.T) {
		cl := NewClient(t, []string{p.Addr})
		defer cl.Close()
		adm := kadm.NewClient(cl)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		rcs, err := adm.DescribeTopicConfigs(ctx, "vpay.analytics", "vpay")
		if err != nil {
			t.Fatal(err)
		}
		configs := map[string]map[string]string{}
		for _, rc := range rcs {
			if rc.Err != nil {
				t.Fatalf("DescribeConfigs %s: %v", rc.Name, rc.Err)
			}
			configs[rc.Name] = map[string]string{}
			for _, c := range rc.Configs {
				configs[rc.Name][c.Key] = c.MaybeValue()
			}
		}
		if len(configs["vpay.analytics"]) == 0 || len(configs["vpay.analytics"]) != len(configs["vpay"]) {
			t.Errorf("configs of the view %v, of the topic %v", configs["vpay.analytics"], configs["vpay"])
		}
		for key, v := range configs["vpay"] {
			if configs["vpay.analytics"][key] != v {
				t.Errorf("config %s: view %q, topic %q", key, configs["vpay.analytics"][key], v)
			}
		}
		for _, list := range []func(context.Context, ...string) (kadm.ListedOffsets, error){adm.ListStartOffsets, adm.ListEndOffsets} {
			lo, err := list(ctx, "vpay.analytics", "vpay")
			if err != nil {
				t.Fatal(err)
			}
			for part := int32(0); part < 3; part++ {
				v, vok := lo.Lookup("vpay.analytics", part)
				r, rok := lo.Lookup("vpay", part)
				if !vok || !rok || v.Err != nil || v.Offset != r.Offset {
					t.Errorf("partition %d: view %+v, topic %+v", part, v, r)
				}
			}
		}
		del, err := adm.DeleteTopics(ctx, "vpay.analytics")
		if err != nil {
			t.Fatal(err)
		}
		if d := del["vpay.analytics"]; !errors.Is(d.Err, kerr.InvalidTopicException) || !strings.Contains(d.ErrMessage, "is a view") {
			t.Errorf("DeleteTopics of the view: %v %q", d.Err, d.ErrMessage)
		}
		md, err := adm.Metadata(ctx, "vpay")
		if err != nil || md.Topics["vpay"].Err != nil || len(md.Topics["vpay"].Partitions) != 3 {
			t.Errorf("vpay after the refused delete: %+v %v", md.Topics["vpay"], err)
		}
	})

	t.Run("kcat consumes a topic and its view at once", func(t *testing.T) {
		RequireTool(t, "kcat")
		want := len(at) + kept
		out := runClient(t, "", 60*time.Second, "kcat", "-b", p.Addr, "-G", "views-both", "-X", "auto.offset.reset=earliest",
			"-X", "enable.auto.commit=false", "-c", strconv.Itoa(want), "-q", "-f", "%t\t%p\t%o\t%s\n", "vpay", "vpay.analytics")
		byTopic := map[string][]viewRec{}
		for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			f := strings.SplitN(l, "\t", 4)
			if len(f) != 4 {
				continue
			}
			part, _ := strconv.Atoi(f[1])
			o, _ := strconv.ParseInt(f[2], 10, 64)
			v := f[3]
			r := viewRec{Partition: int32(part), Offset: o, Value: &v}
			if strings.HasPrefix(v, "not json") || v == "" {
				r.Value = nil // kcat prints a null value as empty
			}
			byTopic[f[0]] = append(byTopic[f[0]], r)
		}
		if got := len(byTopic["vpay"]); got != len(at) {
			t.Errorf("vpay: %d records, want %d", got, len(at))
		}
		for _, r := range byTopic["vpay"] {
			i := at[viewPOff{r.Partition, r.Offset}]
			if r.Value != nil && *r.Value != viewInputValue(i) {
				t.Errorf("vpay %d/%d: %s, want the original %s", r.Partition, r.Offset, *r.Value, viewInputValue(i))
			}
		}
		if got := len(byTopic["vpay.analytics"]); got != kept {
			t.Errorf("vpay.analytics: %d records, want %d", got, kept)
		}
		for _, r := range byTopic["vpay.analytics"] {
			i, ok := at[viewPOff{r.Partition, r.Offset}]
			if !ok || !viewKept(i) {
				t.Errorf("vpay.analytics %d/%d: not a record the view keeps", r.Partition, r.Offset)
				continue
			}
			if r.Value != nil && (strings.Contains(*r.Value, "4111-1111") || strings.Contains(*r.Value, `"status":"test"`)) {
				t.Errorf("vpay.analytics %d/%d: %s in clear", r.Partition, r.Offset, *r.Value)
			}
		}
	})

	t.Run("a view over Avro values", func(t *testing.T) {
		// A value in the Confluent wire format (schema id 42, an Avro
		// record {status, card}): the json view withholds it and says why.
		avro := []byte{0, 0, 0, 0, 42, 4, 'o', 'k', 32}
		avro = append(avro, "4111111111111111"...)
		cl := NewClient(t, k.Addrs, kgo.RecordPartitioner(kgo.ManualPartitioner()))
		r := &kgo.Record{Topic: "vpay", Partition: 1, Value: avro}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		cl.Close()
		cons := NewClient(t, []string{p.Addr}, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
			"vpay.analytics": {1: kgo.NewOffset().At(r.Offset)}}))
		defer cons.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var got *kgo.Record
		for got == nil && ctx.Err() == nil {
			cons.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
				if rec.Offset == r.Offset {
					got = rec
				}
			})
		}
		if got == nil {
			t.Fatal("the Avro record never arrived through the view")
		}
		if got.Value != nil || len(got.Headers) != 1 || got.Headers[0].Key != "rtproxy-view-error" ||
			!strings.Contains(string(got.Headers[0].Value), "Confluent wire format (schema id 42") {
			t.Errorf("the Avro record through the view: value %q headers %v", got.Value, got.Headers)
		}
	})
}
