// Package jsonbench compares JSON libraries (and rtproxy's own codec,
// jsoncodec.Decode and jsoncodec.Append) on rtproxy's workload: decode a
// 1 KiB payment-like object into `any` (numbers as float64) and encode it
// back. It is its own module so the candidates never enter rtproxy's go.mod.
//
// The Partial benchmarks (partial_test.go) compare jsoncodec.DecodeMembers
// and jsoncodec.SpliceMembers with the libraries that read or write single
// members of a record: tidwall/gjson and sjson, valyala/fastjson,
// bytedance/sonic/ast and minio/simdjson-go.
package jsonbench

import (
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/bytedance/sonic"
	gojson "github.com/goccy/go-json"
	jsoniter "github.com/json-iterator/go"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
)

// payment builds a payment-like JSON object of about 1 KiB.
func payment(i int) []byte {
	s := fmt.Sprintf(`{"txn_id":"txn-%08d","user_id":"user-%05d","merchant_id":"m-%05d","amount":%d.%02d,"currency":"EUR","status":"settled","ts":%d,"card":{"bin":"424242","last4":"%04d","brand":"visa","country":"DE","expiry":"12/29"},"device":{"id":"dev-%08x","os":"android","version":"14.2.1","ip":"10.%d.%d.%d","user_agent":"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Mobile Safari/537.36"},"shipping":{"name":"Erika Mustermann","street":"Heidestrasse 17","city":"Koeln","zip":"51147","country":"DE"},"items":[{"sku":"sku-1001","qty":1,"price":19.99},{"sku":"sku-2002","qty":2,"price":5.5},{"sku":"sku-3003","qty":1,"price":42}],"risk":{"score":0.137,"rules":["velocity","geo","bin"],"reviewed":false},"tags":["online","recurring","eu"],"note":"%s"}`,
		i, i%10000, i%100000, i%500, i%100, 1700000000000+int64(i)*7, i%10000, i, i%256, (i/256)%256, i%200, "")
	pad := 1024 - len(s)
	if pad < 0 {
		pad = 0
	}
	b := make([]byte, pad)
	for j := range b {
		b[j] = 'x'
	}
	return []byte(s[:len(s)-2] + string(b) + `"}`)
}

// cpuNow is the CPU time of this process: on a shared machine the wall
// clock includes other processes' turns, so with -cpu 1 the CPU time per
// op is the number to compare.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64((cpuNow()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

var encBuf = make([]byte, 0, 4096)

type lib struct {
	name string
	dec  func([]byte) (any, error)
	enc  func(any) ([]byte, error)
}

var libs = []lib{
	{"encoding/json", func(b []byte) (any, error) { var v any; err := json.Unmarshal(b, &v); return v, err }, json.Marshal},
	{"goccy/go-json", func(b []byte) (any, error) { var v any; err := gojson.Unmarshal(b, &v); return v, err }, gojson.Marshal},
	{"json-iterator", func(b []byte) (any, error) {
		var v any
		err := jsoniter.ConfigCompatibleWithStandardLibrary.Unmarshal(b, &v)
		return v, err
	}, jsoniter.ConfigCompatibleWithStandardLibrary.Marshal},
	{"sonic", func(b []byte) (any, error) { var v any; err := sonic.ConfigStd.Unmarshal(b, &v); return v, err }, sonic.ConfigStd.Marshal},
	// jsoncodec.Append appends to the caller's buffer; the sink reuses one, so
	// the benchmark does too.
	{"rtproxy", jsoncodec.Decode, func(v any) ([]byte, error) { return jsoncodec.Append(encBuf[:0], v) }},
}

func BenchmarkDecode(b *testing.B) {
	in := payment(7)
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			cpu0 := cpuNow()
			for b.Loop() {
				if _, err := l.dec(in); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu0)
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	in := payment(7)
	for _, l := range libs {
		v, _ := libs[0].dec(in)
		b.Run(l.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := cpuNow()
			for b.Loop() {
				if _, err := l.enc(v); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu0)
		})
	}
}

func TestSameResult(t *testing.T) {
	in := payment(7)
	if len(in) != 1024 {
		t.Fatalf("payment is %d bytes", len(in))
	}
	want, _ := libs[0].dec(in)
	wb, _ := json.Marshal(want)
	for _, l := range libs[1:] {
		v, err := l.dec(in)
		if err != nil {
			t.Fatal(l.name, err)
		}
		got, _ := json.Marshal(v)
		if string(got) != string(wb) {
			t.Errorf("%s decodes differently", l.name)
		}
	}
}
