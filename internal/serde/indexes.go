package serde

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// IndexEncoding is how a Protobuf record's message indexes (the path of
// its message within the schema's file, after the schema id) are written.
// Both encodings write [count, index...] as varints and the first message
// of the file as the one byte 0; they differ in the varints:
//
//   - IndexesZigzag: zigzag (signed) varints, as the Java, Go and .NET
//     serializers and confluent-kafka-python ≥ 1.8.2 write them. The
//     default.
//   - IndexesUnsigned: plain unsigned varints, as confluent-kafka-python
//     ≤ 1.7 wrote them (and later versions with use.deprecated.format).
//
// A record does not say which it is ([1, 2] unsigned and [1, 1] zigzag are
// the same bytes), so a route says: source.message_indexes and
// sink.message_indexes (docs/RULES.md).
type IndexEncoding uint8

const (
	IndexesZigzag IndexEncoding = iota
	IndexesUnsigned
)

func (e IndexEncoding) String() string {
	if e == IndexesUnsigned {
		return "unsigned"
	}
	return "zigzag"
}

// ParseIndexEncoding reads the rule-file name of an encoding: "zigzag"
// (or "") and "unsigned".
func ParseIndexEncoding(s string) (IndexEncoding, error) {
	switch s {
	case "", "zigzag":
		return IndexesZigzag, nil
	case "unsigned":
		return IndexesUnsigned, nil
	}
	return 0, fmt.Errorf("message indexes %q: want zigzag or unsigned", s)
}

// appendIndexes appends the message indexes idx in encoding e.
func appendIndexes(b []byte, idx []int, e IndexEncoding) []byte {
	if len(idx) == 1 && idx[0] == 0 {
		return append(b, 0)
	}
	put := func(b []byte, n int) []byte {
		if e == IndexesUnsigned {
			return binary.AppendUvarint(b, uint64(n))
		}
		return binary.AppendVarint(b, int64(n))
	}
	b = put(b, len(idx))
	for _, i := range idx {
		b = put(b, i)
	}
	return b
}

var errIndexes = errors.New("protobuf message indexes")

// readIndexes reads the message indexes at the start of b (encoding e)
// and returns them and the message bytes after them. At most maxIndexes;
// every index is checked against the schema later (protoMessage).
func readIndexes(b []byte, e IndexEncoding) ([]int, []byte, error) {
	next := func() (int64, error) {
		if e == IndexesUnsigned {
			u, n := binary.Uvarint(b)
			if n <= 0 {
				return 0, fmt.Errorf("%w: a truncated or overlong varint", errIndexes)
			}
			b = b[n:]
			if u > 1<<31 {
				return 0, fmt.Errorf("%w: index %d out of range", errIndexes, u)
			}
			return int64(u), nil
		}
		v, n := binary.Varint(b)
		if n <= 0 {
			return 0, fmt.Errorf("%w: a truncated or overlong varint", errIndexes)
		}
		b = b[n:]
		if v < 0 {
			return 0, fmt.Errorf("%w: negative count or index %d (written by confluent-kafka ≤ 1.7 or with use.deprecated.format? set message_indexes: unsigned)", errIndexes, v)
		}
		if v > 1<<31 {
			return 0, fmt.Errorf("%w: index %d out of range", errIndexes, v)
		}
		return v, nil
	}
	count, err := next()
	if err != nil {
		return nil, nil, err
	}
	if count == 0 { // the first message's shortcut
		return []int{0}, b, nil
	}
	if count > maxIndexes {
		return nil, nil, fmt.Errorf("%w: %d of them, more than %d", errIndexes, count, maxIndexes)
	}
	idx := make([]int, count)
	for i := range idx {
		v, err := next()
		if err != nil {
			return nil, nil, err
		}
		idx[i] = int(v)
	}
	return idx, b, nil
}
