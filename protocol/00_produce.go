package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Produce (key 0).
//
// Requests: acks=0 produces get no response, so the connection does not
// queue them as in flight (see conn.go). Responses v0-v9 carry no address
// and are forwarded raw, and stream (v0-v8 have no tagged fields at all; v9
// is flexible, but the endpoints field exists from KIP-951's v10 on). v10+
// may carry, in top-level tag 0, the endpoints of the new leaders of
// partitions that failed with NOT_LEADER_OR_FOLLOWER; the partition's
// CurrentLeader names the node id. The body is walked without decoding to
// see whether any top-level tag is present; only then is it decoded, the
// endpoints mapped to the proxy's listeners (node ids unchanged, so
// CurrentLeader stays consistent) and re-encoded. A healthy produce path
// never decodes.
//
// v10+ layout walked (all compact, flexible):
//
//	[topics: name (v0-12) | topic id (v13+),
//	  [partitions: int32 index, int16 error, int64 base offset,
//	    int64 log append time, int64 log start offset,
//	    [record errors: int32, nullable string, tags],
//	    nullable string error message, tags],
//	  tags]
//	int32 throttle millis
//	tags  <- node endpoints live here
func rewriteProduce(m Mapper, version int16, body, dst []byte) ([]byte, bool, error) {
	if version < 10 { // no endpoints field before KIP-951's v10
		return nil, false, nil
	}
	if !produceHasTopTags(version, body) {
		return nil, false, nil
	}
	r, err := decodeResponse(int16(kmsg.Produce), version, body)
	if err != nil {
		return nil, false, err
	}
	resp := r.(*kmsg.ProduceResponse)
	if len(resp.Brokers) == 0 {
		return nil, false, nil
	}
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

// produceHasTopTags reports whether a v9+ Produce response body has any
// top-level tagged field. A body it cannot walk reports true, so that the
// full decoder gets to say what is wrong with it.
func produceHasTopTags(version int16, body []byte) bool {
	s := skipper{p: body}
	for t := s.arrayLen(); t > 0 && !s.bad; t-- {
		if version >= 13 {
			s.skip(16)
		} else {
			s.compactBytes()
		}
		for p := s.arrayLen(); p > 0 && !s.bad; p-- {
			s.skip(4 + 2 + 8 + 8 + 8)
			for e := s.arrayLen(); e > 0 && !s.bad; e-- {
				s.skip(4)
				s.compactBytes()
				s.tags()
			}
			s.compactBytes()
			s.tags()
		}
		s.tags()
	}
	s.skip(4)
	n, ok := s.topLevelTagCount()
	return !ok || n > 0
}
