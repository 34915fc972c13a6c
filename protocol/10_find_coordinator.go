package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FindCoordinator (key 10), v0-v6.
//
// v0-v3 answer for one key with a top-level NodeID/Host/Port; v4+ answer a
// batch, one Coordinator entry per key. Each coordinator that was found is
// replaced by the proxy's listener for its node id. Entries with an empty
// host carry no address and are left as they are; an entry with a negative
// node id (an error) but a host gets its address blanked (host "", port -1),
// since there is no broker to proxy it to and it must not leak.
func rewriteFindCoordinator(m Mapper, version int16, body, dst []byte) ([]byte, bool, error) {
	r, err := decodeResponse(int16(kmsg.FindCoordinator), version, body)
	if err != nil {
		return nil, false, err
	}
	resp := r.(*kmsg.FindCoordinatorResponse)
	if version < 4 {
		h, p, err := mapCoordinator(m, resp.NodeID, resp.Host, resp.Port)
		if err != nil {
			return nil, false, err
		}
		resp.Host, resp.Port = h, p
	} else {
		for i := range resp.Coordinators {
			c := &resp.Coordinators[i]
			h, p, err := mapCoordinator(m, c.NodeID, c.Host, c.Port)
			if err != nil {
				return nil, false, err
			}
			c.Host, c.Port = h, p
		}
	}
	return resp.AppendTo(dst), true, nil
}

func mapCoordinator(m Mapper, node int32, host string, port int32) (string, int32, error) {
	switch {
	case host == "":
		return host, port, nil
	case node < 0:
		return "", -1, nil
	}
	return m.MapBroker(node, host, port)
}
