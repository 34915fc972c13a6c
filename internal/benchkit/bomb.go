package benchkit

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"log"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// zstdAttribute is a record batch's compression attribute for zstd.
const zstdAttribute = 4

// TinyRecordsBomb is a Produce request (acks=all) to partition 0 of topic
// holding one zstd batch of n records of 7 bytes, all at offset delta 0:
// millions of records in a few kilobytes (issue 25, finding 3). The batch
// header claims claim records (n when 0). An honest bomb's zstd frame
// declares its size; a lying one is streamed, so that the frame does not
// declare it and a proxy finds out only by decompressing, and must stop at
// its bound. The soak's hostile client and test/integration share it.
func TinyRecordsBomb(topic string, n, claim int) *kmsg.ProduceRequest {
	if claim == 0 {
		claim = n
	}
	rec := []byte{6, 0, 0, 0, 1, 1, 0} // length 6, attributes, ts delta 0, offset delta 0, key null, value null, 0 headers
	raw := bytes.Repeat(rec, n)
	var packed []byte
	if claim == n {
		comp, err := kgo.DefaultCompressor(kgo.ZstdCompression())
		if err != nil {
			log.Fatal(err)
		}
		packed, _ = comp.Compress(bytes.NewBuffer(nil), raw)
		packed = append([]byte(nil), packed...) // the compressor reuses its buffer
	} else {
		var buf bytes.Buffer
		zw, err := zstd.NewWriter(&buf)
		if err != nil {
			log.Fatal(err)
		}
		zw.Write(raw)
		zw.Close()
		packed = buf.Bytes()
	}
	now := time.Now().UnixMilli()
	rb := kmsg.RecordBatch{Magic: 2, Attributes: zstdAttribute, NumRecords: int32(claim),
		LastOffsetDelta: int32(claim - 1), FirstTimestamp: now, MaxTimestamp: now, ProducerID: -1, ProducerEpoch: -1,
		FirstSequence: -1, Records: packed}
	b := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 10000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = b
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return req
}
