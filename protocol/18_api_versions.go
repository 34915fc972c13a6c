package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ApiVersions (key 18), v0-v5 (kmsg's range).
//
// The response header is always v0, even for the flexible v3+ request:
// a client must be able to read it before it knows what the broker speaks
// (responseHeaderFlexible encodes that exception).
//
// The answer is the intersection of the broker's ranges with what kmsg can
// decode: keys kmsg does not know are dropped, and each max version is
// lowered to kmsg's. That way every response the proxy must rewrite is one
// it can read, whatever the client and broker would otherwise agree on.
//
// When the broker does not support the requested version it answers
// UNSUPPORTED_VERSION with a v0-encoded body (listing its ApiVersions
// range) so that the client can retry lower; the proxy then decodes and
// re-encodes at v0, capping that list the same way.
//
// SaslHandshake is raised to a minimum of v1: after a v0 handshake the SASL
// tokens travel as bare size-prefixed blobs with no request header, which
// a header-parsing proxy cannot tell from requests. v1+ wraps them in
// SaslAuthenticate, which passes through raw like any other request.
// Kafka 4.0 removed v0 as well (KIP-896).
func rewriteApiVersions(_ Mapper, version int16, body, dst []byte) ([]byte, bool, error) {
	r, err := decodeResponse(int16(kmsg.ApiVersions), version, body)
	if err == nil && version > 0 && r.(*kmsg.ApiVersionsResponse).ErrorCode == errUnsupportedVersion {
		// A v0 body can happen to parse at a higher version; the error
		// code is what says which one the broker wrote.
		if r0, err0 := decodeResponse(int16(kmsg.ApiVersions), 0, body); err0 == nil {
			r, version = r0, 0
		}
	}
	if err != nil && version > 0 {
		version = 0
		r, err = decodeResponse(int16(kmsg.ApiVersions), 0, body)
	}
	if err != nil {
		return nil, false, err
	}
	resp := r.(*kmsg.ApiVersionsResponse)
	resp.ApiKeys = intersectApiKeys(resp.ApiKeys)
	return resp.AppendTo(dst), true, nil
}

// errUnsupportedVersion is Kafka's UNSUPPORTED_VERSION error code.
const errUnsupportedVersion = 35

// intersectApiKeys caps broker ranges to kmsg's, in place.
func intersectApiKeys(keys []kmsg.ApiVersionsResponseApiKey) []kmsg.ApiVersionsResponseApiKey {
	out := keys[:0]
	for _, k := range keys {
		if k.ApiKey < 0 || int(k.ApiKey) > maxKnownKey || kmsgMax[k.ApiKey] < 0 {
			continue
		}
		if k.MaxVersion > kmsgMax[k.ApiKey] {
			k.MaxVersion = kmsgMax[k.ApiKey]
		}
		if k.ApiKey == int16(kmsg.SASLHandshake) && k.MinVersion < 1 {
			k.MinVersion = 1
		}
		if k.MaxVersion < k.MinVersion {
			continue
		}
		out = append(out, k)
	}
	return out
}
