package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ShareFetch (key 78), v0+ (always flexible).
//
// Like Fetch v16+, a share fetch that hit a moved leader returns the new
// leader's id per partition and its address in NodeEndpoints. Those
// endpoints are rewritten to the proxy's listeners; leader ids are kept.
// Responses without endpoints are forwarded untouched.
func rewriteShareFetch(m Mapper, version int16, body, dst []byte) ([]byte, bool, error) {
	r, err := decodeResponse(int16(kmsg.ShareFetch), version, body)
	if err != nil {
		return nil, false, err
	}
	resp := r.(*kmsg.ShareFetchResponse)
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
