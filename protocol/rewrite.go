package protocol

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Mapper is what a response rewriter needs from the proxy: the advertised
// address for an upstream broker (learning the broker's upstream address on
// the way, and opening its listener if this is the first sighting), and a
// place to record topic ids.
type Mapper interface {
	// MapBroker returns the host and port a client must use for node,
	// whose upstream address is host:port.
	MapBroker(node int32, host string, port int32) (string, int32, error)
	// LearnTopic records that a topic id names a topic.
	LearnTopic(id [16]byte, name string)
}

// rewriteFunc rewrites the body of one response kind. It appends the new
// body to dst and reports changed=false when the original bytes can be
// forwarded as they are (the common case for Produce and Fetch).
type rewriteFunc func(m Mapper, version int16, body, dst []byte) (out []byte, changed bool, err error)

// rewriters lists every API key whose responses carry broker addresses
// (or, for ApiVersions, version ranges the proxy caps). Everything else is
// forwarded raw. Each entry lives in its own file named after the key.
var rewriters = map[int16]rewriteFunc{
	int16(kmsg.Produce):          rewriteProduce,
	int16(kmsg.Fetch):            rewriteFetch,
	int16(kmsg.Metadata):         rewriteMetadata,
	int16(kmsg.FindCoordinator):  rewriteFindCoordinator,
	int16(kmsg.ApiVersions):      rewriteApiVersions,
	int16(kmsg.DescribeCluster):  rewriteDescribeCluster,
	int16(kmsg.ShareFetch):       rewriteShareFetch,
	int16(kmsg.ShareAcknowledge): rewriteShareAcknowledge,
}

// rewriterTable is rewriters as an array, for a branch-free hot-path lookup.
var rewriterTable [maxKnownKey + 1]rewriteFunc

func init() {
	for k, f := range rewriters {
		rewriterTable[k] = f
	}
}

func rewriterFor(key int16) rewriteFunc {
	if key < 0 || int(key) > maxKnownKey {
		return nil
	}
	return rewriterTable[key]
}

// decodeResponse decodes body as the response for key at version.
func decodeResponse(key, version int16, body []byte) (kmsg.Response, error) {
	r := kmsg.ResponseForKey(key)
	r.SetVersion(version)
	if err := r.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("decode %s v%d response: %w", kmsg.NameForKey(key), version, err)
	}
	return r, nil
}
