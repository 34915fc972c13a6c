package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Request header layouts (after the 4-byte frame size):
//
//	v1 (non-flexible requests):
//	  int16  api key
//	  int16  api version
//	  int32  correlation id
//	  int16  client id length (-1 = null), then that many bytes
//	v2 (flexible requests, KIP-482): v1 followed by
//	  uvarint number of tagged fields, then per field uvarint tag,
//	  uvarint size and size bytes
//
// The client id stays a non-compact string even in v2. Response headers are
// v0 (int32 correlation id) or, for flexible responses, v1 (v0 plus tagged
// fields) — except ApiVersions, whose response header is always v0 so that
// a client can read it before it knows what the broker speaks.

// ErrBadHeader is wrapped by every header parse failure.
var ErrBadHeader = errors.New("malformed request header")

// RequestHeader is what the hot path learns about a request.
type RequestHeader struct {
	APIKey        int16
	APIVersion    int16
	CorrelationID int32
	// ClientID aliases the frame; nil when the client sent a null id.
	ClientID []byte
	// Flexible is true when the header is v2 (the request is flexible).
	Flexible bool
	// BodyOffset is where the request body starts in the payload (the
	// bytes after the 4-byte size).
	BodyOffset int
}

// maxKnownKey bounds the tables indexed by API key.
const maxKnownKey = 127

// flexibleFrom[k] is the first flexible version of key k, or -1 when kmsg
// does not know the key. kmsgMax[k] is the highest version kmsg decodes.
var (
	flexibleFrom [maxKnownKey + 1]int16
	kmsgMax      [maxKnownKey + 1]int16
)

func init() {
	for k := range flexibleFrom {
		flexibleFrom[k], kmsgMax[k] = -1, -1
		r := kmsg.RequestForKey(int16(k))
		if r == nil {
			continue
		}
		kmsgMax[k] = r.MaxVersion()
		flexibleFrom[k] = r.MaxVersion() + 1 // versions past kmsg's are flexible: KIP-482 is one-way
		for v := int16(0); v <= r.MaxVersion(); v++ {
			r.SetVersion(v)
			if r.IsFlexible() {
				flexibleFrom[k] = v
				break
			}
		}
	}
}

// isFlexible reports whether key at version uses flexible (tagged) headers
// and encoding. Unknown keys are treated as non-flexible; the proxy only
// forwards them raw, so their body offset is never used.
func isFlexible(key, version int16) bool {
	if key < 0 || int(key) > maxKnownKey || flexibleFrom[key] < 0 {
		return false
	}
	return version >= flexibleFrom[key]
}

// responseHeaderFlexible reports whether the response header carries
// tagged fields (header v1).
func responseHeaderFlexible(key, version int16) bool {
	return key != int16(kmsg.ApiVersions) && isFlexible(key, version)
}

// ParseRequestHeader parses a request header from a frame payload (the
// bytes after the size prefix). It never allocates.
func ParseRequestHeader(p []byte) (RequestHeader, error) {
	var h RequestHeader
	if len(p) < 10 {
		return h, fmt.Errorf("%w: %d bytes, need at least 10", ErrBadHeader, len(p))
	}
	h.APIKey = int16(binary.BigEndian.Uint16(p))
	h.APIVersion = int16(binary.BigEndian.Uint16(p[2:]))
	h.CorrelationID = int32(binary.BigEndian.Uint32(p[4:]))
	if h.APIKey < 0 {
		return h, fmt.Errorf("%w: negative api key %d", ErrBadHeader, h.APIKey)
	}
	if h.APIVersion < 0 {
		return h, fmt.Errorf("%w: negative api version %d", ErrBadHeader, h.APIVersion)
	}
	idLen := int(int16(binary.BigEndian.Uint16(p[8:])))
	off := 10
	switch {
	case idLen == -1:
	case idLen < -1:
		return h, fmt.Errorf("%w: client id length %d", ErrBadHeader, idLen)
	case off+idLen > len(p):
		return h, fmt.Errorf("%w: client id length %d overruns %d-byte frame", ErrBadHeader, idLen, len(p))
	default:
		h.ClientID = p[off : off+idLen]
		off += idLen
	}
	if isFlexible(h.APIKey, h.APIVersion) {
		h.Flexible = true
		n, err := skipTags(p, off)
		if err != nil {
			return h, fmt.Errorf("%w: tagged fields: %v", ErrBadHeader, err)
		}
		off = n
	}
	h.BodyOffset = off
	return h, nil
}

// uvarint reads an unsigned varint at off, returning the value and the
// offset after it.
func uvarint(p []byte, off int) (uint64, int, error) {
	if off > len(p) {
		return 0, off, errShort
	}
	v, n := binary.Uvarint(p[off:])
	if n <= 0 {
		return 0, off, errors.New("bad uvarint")
	}
	return v, off + n, nil
}

var errShort = errors.New("not enough bytes")

// skipTags skips a tagged-field section starting at off.
func skipTags(p []byte, off int) (int, error) {
	n, off, err := uvarint(p, off)
	if err != nil {
		return off, err
	}
	for i := uint64(0); i < n; i++ {
		if _, off, err = uvarint(p, off); err != nil { // tag
			return off, err
		}
		var size uint64
		if size, off, err = uvarint(p, off); err != nil {
			return off, err
		}
		if size > uint64(len(p)-off) {
			return off, errShort
		}
		off += int(size)
	}
	return off, nil
}

// produceAcks returns the acks field of a Produce request body. Produce
// v0-v2 start with acks; v3+ put the transactional id first (a compact
// nullable string from v9, a classic one before).
func produceAcks(p []byte, h RequestHeader) (int16, error) {
	off, err := produceAcksOffset(p, h)
	if err != nil {
		return 0, err
	}
	return int16(binary.BigEndian.Uint16(p[off:])), nil
}

// produceSoleTopic reads, from the head of a Produce request, its topic
// when it names exactly one: its name (v0-v12) or its id (v13+); ok false
// when it names several, or the head is too short to tell.
func produceSoleTopic(p []byte, h RequestHeader) (name string, id [16]byte, ok bool) {
	off, err := produceAcksOffset(p, h)
	if err != nil {
		return "", id, false
	}
	off += 2 + 4 // acks, timeout
	var n int64
	if h.Flexible {
		v, next, err := uvarint(p, off)
		if err != nil {
			return "", id, false
		}
		n, off = int64(v)-1, next
	} else {
		if off+4 > len(p) {
			return "", id, false
		}
		n, off = int64(int32(binary.BigEndian.Uint32(p[off:]))), off+4
	}
	if n != 1 {
		return "", id, false
	}
	if h.APIVersion >= 13 {
		if off+16 > len(p) {
			return "", id, false
		}
		copy(id[:], p[off:])
		return "", id, true
	}
	var l int
	if h.Flexible {
		v, next, err := uvarint(p, off)
		if err != nil || v == 0 {
			return "", id, false
		}
		l, off = int(v-1), next
	} else {
		if off+2 > len(p) {
			return "", id, false
		}
		l, off = int(int16(binary.BigEndian.Uint16(p[off:]))), off+2
	}
	if l < 0 || l > len(p)-off {
		return "", id, false
	}
	return string(p[off : off+l]), id, true
}

// produceAcksOffset is where a Produce request's acks field starts in p
// (the payload after the size), past the transactional id from v3 on.
func produceAcksOffset(p []byte, h RequestHeader) (int, error) {
	off := h.BodyOffset
	if h.APIVersion >= 3 {
		if h.Flexible {
			l, n, err := uvarint(p, off)
			if err != nil {
				return 0, err
			}
			off = n
			if l > 0 {
				if l-1 > uint64(len(p)-off) {
					return 0, errShort
				}
				off += int(l - 1)
			}
		} else {
			if off+2 > len(p) {
				return 0, errShort
			}
			l := int(int16(binary.BigEndian.Uint16(p[off:])))
			off += 2
			if l > 0 {
				if l > len(p)-off {
					return 0, errShort
				}
				off += l
			}
		}
	}
	if off+2 > len(p) {
		return 0, errShort
	}
	return off, nil
}

// responseBodyOffset returns where the body of a response payload starts:
// after the correlation id and, for header v1, the tagged fields.
func responseBodyOffset(p []byte, key, version int16) (int, error) {
	if len(p) < 4 {
		return 0, errShort
	}
	if !responseHeaderFlexible(key, version) {
		return 4, nil
	}
	return skipTags(p, 4)
}
