package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FindCoordinator (key 10), v0-v6.
//
// v0-v3 answer for one key with a top-level NodeID/Host/Port; v4+ answer a
// batch, one Coordinator entry per key. Each coordinator that was found is
// replaced by the proxy's listener for its node id. Entries with an error
// (node id -1, empty host) carry no address and are left as they are.
func rewriteFindCoordinator(m Mapper, version int16, body, dst []byte) ([]byte, bool, error) {
	r, err := decodeResponse(int16(kmsg.FindCoordinator), version, body)
	if err != nil {
		return nil, false, err
	}
	resp := r.(*kmsg.FindCoordinatorResponse)
	if version < 4 {
		if resp.NodeID >= 0 && resp.Host != "" {
			h, p, err := m.MapBroker(resp.NodeID, resp.Host, resp.Port)
			if err != nil {
				return nil, false, err
			}
			resp.Host, resp.Port = h, p
		}
	} else {
		for i := range resp.Coordinators {
			c := &resp.Coordinators[i]
			if c.NodeID < 0 || c.Host == "" {
				continue
			}
			h, p, err := m.MapBroker(c.NodeID, c.Host, c.Port)
			if err != nil {
				return nil, false, err
			}
			c.Host, c.Port = h, p
		}
	}
	return resp.AppendTo(dst), true, nil
}
