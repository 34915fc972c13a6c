package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Metadata (key 3), all versions v0-v13 that kmsg decodes.
//
// Every broker in the response is replaced by the proxy's listener for that
// node id: host becomes advertise_host, port the node's stable port. Node
// ids are left alone, so partition leaders, replicas and the controller id
// keep pointing at the same (now proxied) brokers. Topic ids (v10+) are
// recorded so Produce/Fetch v13+, which carry only ids, can be matched to
// topic names. The response is always re-encoded: every Metadata response
// carries broker addresses.
func rewriteMetadata(m Mapper, version int16, body, dst []byte) ([]byte, bool, error) {
	r, err := decodeResponse(int16(kmsg.Metadata), version, body)
	if err != nil {
		return nil, false, err
	}
	resp := r.(*kmsg.MetadataResponse)
	for i := range resp.Brokers {
		b := &resp.Brokers[i]
		h, p, err := m.MapBroker(b.NodeID, b.Host, b.Port)
		if err != nil {
			return nil, false, err
		}
		b.Host, b.Port = h, p
	}
	var zero [16]byte
	for _, t := range resp.Topics {
		if t.Topic != nil && t.TopicID != zero {
			m.LearnTopic(t.TopicID, *t.Topic)
		}
	}
	return resp.AppendTo(dst), true, nil
}
