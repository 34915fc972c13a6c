package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeCluster (key 60), v0-v2.
//
// Admin clients list brokers through this API instead of Metadata; every
// broker is replaced by the proxy's listener for its node id. v1+ can be
// asked for controllers (EndpointType 2) instead of brokers; those are
// mapped the same way so no upstream address is ever shown.
func rewriteDescribeCluster(m Mapper, version int16, body, dst []byte) ([]byte, bool, error) {
	r, err := decodeResponse(int16(kmsg.DescribeCluster), version, body)
	if err != nil {
		return nil, false, err
	}
	resp := r.(*kmsg.DescribeClusterResponse)
	for i := range resp.Brokers {
		b := &resp.Brokers[i]
		h, p, err := m.MapBroker(b.NodeID, b.Host, b.Port)
		if err != nil {
			return nil, false, err
		}
		b.Host, b.Port = h, p
	}
	return resp.AppendTo(dst), true, nil
}
