package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ShareAcknowledge (key 79), v0+ (always flexible).
//
// Carries NodeEndpoints for partitions whose leader moved, exactly like
// ShareFetch; they are rewritten to the proxy's listeners and leader ids
// are kept. Responses without endpoints are forwarded untouched.
func rewriteShareAcknowledge(m Mapper, version int16, body, dst []byte) ([]byte, bool, error) {
	r, err := decodeResponse(int16(kmsg.ShareAcknowledge), version, body)
	if err != nil {
		return nil, false, err
	}
	resp := r.(*kmsg.ShareAcknowledgeResponse)
	if len(resp.NodeEndpoints) == 0 {
		return nil, false, nil
	}
	for i := range resp.NodeEndpoints {
		e := &resp.NodeEndpoints[i]
		h, p, err := m.MapBroker(e.NodeID, e.Host, e.Port)
		if err != nil {
			return nil, false, err
		}
		e.Host, e.Port = h, p
	}
	return resp.AppendTo(dst), true, nil
}
