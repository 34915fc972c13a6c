package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Fetch (key 1).
//
// Responses before v16 are forwarded raw, and stream (needsBody): v0-v11
// have no tagged fields, and v12-v15, flexible, do not have the endpoints
// field, which KIP-951 defines from v16 on (a broker does not send it
// there, and a client does not read it there). v16+ may carry, in
// top-level tag 0, the endpoints of new partition leaders (named by each
// partition's CurrentLeader tag). As for Produce, the body is walked
// without decoding — the record batches are skipped by length — and
// decoded, rewritten and re-encoded only when a top-level tag is present.
// Node ids are kept, so CurrentLeader stays consistent with the endpoints.
//
// v16+ layout walked (all compact, flexible):
//
//	int32 throttle, int16 error, int32 session id
//	[topics: name (v12) | uuid topic id (v13+),
//	  [partitions: int32 index, int16 error, int64 high watermark,
//	    int64 last stable offset, int64 log start offset,
//	    [aborted txns: int64 producer id, int64 first offset, tags],
//	    int32 preferred read replica, nullable bytes records, tags],
//	  tags]
//	tags  <- node endpoints live here
func rewriteFetch(m Mapper, version int16, body, dst []byte) ([]byte, bool, error) {
	if version < 16 { // no endpoints field before KIP-951's v16
		return nil, false, nil
	}
	if !fetchHasTopTags(version, body) {
		return nil, false, nil
	}
	r, err := decodeResponse(int16(kmsg.Fetch), version, body)
	if err != nil {
		return nil, false, err
	}
	resp := r.(*kmsg.FetchResponse)
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

// fetchHasTopTags reports whether a v16+ Fetch response body has any
// top-level tagged field (v12+); an unwalkable body reports true (see Produce).
func fetchHasTopTags(version int16, body []byte) bool {
	s := skipper{p: body}
	s.skip(4 + 2 + 4)
	for t := s.arrayLen(); t > 0 && !s.bad; t-- {
		if version >= 13 {
			s.skip(16)
		} else {
			s.compactBytes()
		}
		for p := s.arrayLen(); p > 0 && !s.bad; p-- {
			s.skip(4 + 2 + 8 + 8 + 8)
			for a := s.arrayLen(); a > 0 && !s.bad; a-- {
				s.skip(16)
				s.tags()
			}
			s.skip(4)
			s.compactBytes()
			s.tags()
		}
		s.tags()
	}
	n, ok := s.topLevelTagCount()
	return !ok || n > 0
}
