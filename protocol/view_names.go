package protocol

// One real topic under several names in one fetch: a client that consumes
// a topic and a view of it (or two views of one topic) names the real
// topic twice once the views are renamed, and a broker keeps one fetch
// position per partition (a second entry replaces the first, in a request
// and in a fetch session). So such a fetch is sent with each real
// partition once, from the lowest offset any of its names asked for (the
// highest byte limit), and its answer is handed to each name: the batches
// that end before the name's own offset are left out (a batch that
// straddles it stays, as a broker sends one: clients skip the records
// before their offset), the records go through the name's view, if any,
// and an OFFSET_OUT_OF_RANGE or a diverging epoch goes to the names that
// asked from the offset sent only (the others get an empty partition and
// ask again). The name ahead waits for the one behind: it gets records
// once the other caught up, one fetch at a time.
//
// Such a fetch holds no fetch session (KIP-227): a broker's session would
// hold one position for both names. The request goes as a full fetch
// without a session (epoch -1, which also closes the session it names),
// and the answer's session id 0 tells the client that its next fetch is a
// full one again (every client does so). The same happens to an
// incremental fetch that would put a second name of a real topic into the
// session the connection holds, or that brings a view into a session the
// proxy did not follow from its start (its topics are not known), and to
// the first incremental fetch after the view set changed (a reload, or the
// client's identity): its session was opened under the old set, and a view
// that now applies to one of its topics would not see an answer the fetch
// does not name.

import (
	"encoding/binary"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fanTopic is one real topic of a fetch under the names it was asked by.
type fanTopic struct {
	names []*fanName
	sent  map[int32]int64 // partition -> the fetch offset sent to the broker
}

// fanName is one name a real topic was asked by.
type fanName struct {
	client string
	id     [16]byte // the id the client named it by (v13+)
	view   View     // nil: the real topic as stored
	parts  map[int32]int64
}

// fetchCollides reports whether a fetch must go without a session: it
// names one real topic under two names, or (incremental) it names a real
// topic its session holds under another name, or brings a view into a
// session the proxy does not follow.
func (pr *pair) fetchCollides(vr *viewReq, st *viewConn, r *kmsg.FetchRequest, full bool) bool {
	if st.fresh {
		// The first fetch since the view set changed: a session opened
		// before holds topics a view may now apply to, unnamed in an
		// incremental fetch.
		st.fresh = false
		if !full {
			return true
		}
	}
	byID := r.Version >= 13
	seen := make(map[string]string, len(r.Topics))
	anyView := false
	for i := range r.Topics {
		t := &r.Topics[i]
		client, ok := pr.resolveName(st, t.Topic, t.TopicID, byID)
		if !ok {
			continue
		}
		real := client
		if v := vr.views.Lookup(client, vr.client); v != nil {
			real, anyView = v.Topic(), true
		}
		if c, dup := seen[real]; dup && c != client {
			return true
		}
		seen[real] = client
		if !full {
			for c, s := range st.sess {
				if s.real == real && c != client {
					return true
				}
			}
		}
	}
	return !full && anyView && st.sess == nil
}

// fanFetchRequest rewrites a fetch that collides (fetchCollides): each
// real partition once, without a session.
func (pr *pair) fanFetchRequest(vr *viewReq, st *viewConn, r *kmsg.FetchRequest) {
	byID := r.Version >= 13
	if r.Version >= 7 {
		r.SessionEpoch = -1 // the session id stays: the broker closes that session
	}
	r.ForgottenTopics = nil
	vr.fan = map[string]*fanTopic{}
	out := make([]kmsg.FetchRequestTopic, 0, len(r.Topics))
	where := map[string]int{}
	for _, t := range r.Topics {
		client, ok := pr.resolveName(st, t.Topic, t.TopicID, byID)
		if !ok {
			out = append(out, t) // an id the proxy does not know: the broker answers for it
			continue
		}
		v := vr.views.Lookup(client, vr.client)
		real := client
		if v != nil {
			real = v.Topic()
		}
		key := real
		var rid [16]byte
		if byID {
			if rid, ok = pr.p.topicID(real); !ok {
				// The real topic's id is not known yet: the broker answers
				// UNKNOWN_TOPIC_ID for the client's, and the client
				// refreshes its metadata.
				out = append(out, t)
				continue
			}
			key = string(rid[:])
		}
		ft := vr.fan[key]
		if ft == nil {
			ft = &fanTopic{sent: map[int32]int64{}}
			vr.fan[key] = ft
			where[key] = len(out)
			nt := kmsg.NewFetchRequestTopic()
			nt.Topic, nt.TopicID = real, rid
			out = append(out, nt)
		}
		var fn *fanName
		for _, n := range ft.names {
			if n.client == client {
				fn = n
			}
		}
		if fn == nil {
			fn = &fanName{client: client, id: t.TopicID, view: v, parts: map[int32]int64{}}
			ft.names = append(ft.names, fn)
		}
		mt := &out[where[key]]
	parts:
		for _, p := range t.Partitions {
			fn.parts[p.Partition] = p.FetchOffset
			for j := range mt.Partitions {
				q := &mt.Partitions[j]
				if q.Partition != p.Partition {
					continue
				}
				if p.FetchOffset < q.FetchOffset {
					q.FetchOffset, q.LastFetchedEpoch = p.FetchOffset, p.LastFetchedEpoch
					ft.sent[p.Partition] = p.FetchOffset
				}
				q.PartitionMaxBytes = max(q.PartitionMaxBytes, p.PartitionMaxBytes)
				continue parts
			}
			mt.Partitions = append(mt.Partitions, p)
			ft.sent[p.Partition] = p.FetchOffset
		}
	}
	r.Topics = out
	st.sess = nil
}

// fanFetchResponse hands each real topic of the answer to the names it
// was asked by (fanFetchRequest).
func (p *Proxy) fanFetchResponse(vr *viewReq, resp *kmsg.FetchResponse, done <-chan struct{}, sc *viewScratch) error {
	byID := resp.Version >= 13
	out := make([]kmsg.FetchResponseTopic, 0, len(resp.Topics)+len(vr.fan))
	for _, t := range resp.Topics {
		key := t.Topic
		if byID {
			key = string(t.TopicID[:])
		}
		ft := vr.fan[key]
		if ft == nil {
			out = append(out, t)
			continue
		}
		for _, fn := range ft.names {
			nt := t
			nt.Topic = fn.client
			if byID {
				nt.TopicID = fn.id
			}
			nt.Partitions = make([]kmsg.FetchResponseTopicPartition, 0, len(fn.parts))
			var c viewCounts
			for _, pp := range t.Partitions {
				off, asked := fn.parts[pp.Partition]
				if !asked {
					continue
				}
				if off != ft.sent[pp.Partition] {
					// Another name asked from an earlier offset: what the
					// broker says of that offset is not this name's.
					if pp.ErrorCode == kerr.OffsetOutOfRange.Code {
						pp.ErrorCode = 0
					}
					pp.DivergingEpoch = kmsg.NewFetchResponseTopicPartitionDivergingEpoch()
				}
				pp.RecordBatches = batchesFrom(pp.RecordBatches, off)
				if fn.view != nil && len(pp.RecordBatches) > 0 {
					m := p.newMeter(done, p.guardBufs)
					rewritten, err := viewPartition(make([]byte, 0, len(pp.RecordBatches)+len(pp.RecordBatches)/16+128), fn.view, pp.Partition, pp.RecordBatches, m, sc, &c)
					m.endPart()
					if err != nil {
						return err
					}
					pp.RecordBatches = rewritten
				}
				nt.Partitions = append(nt.Partitions, pp)
			}
			if fn.view != nil {
				p.vm.count(fn.client, c)
			}
			out = append(out, nt)
		}
	}
	resp.Topics = out
	return nil
}

// batchesFrom leaves out the batches (or old message set entries) of b
// that end before offset off; what cannot be framed is kept as it is.
func batchesFrom(b []byte, off int64) []byte {
	for len(b) >= 17 {
		size := int64(int32(binary.BigEndian.Uint32(b[8:12])))
		if size < 14 || 12+size > int64(len(b)) {
			break
		}
		last := int64(binary.BigEndian.Uint64(b[0:8]))
		if b[16] == 2 {
			if size < 15 { // no room for the last offset delta
				break
			}
			last += int64(int32(binary.BigEndian.Uint32(b[23:27])))
		}
		if last >= off {
			break
		}
		b = b[12+size:]
	}
	return b
}

// The small requests that name topics by name (ListOffsets,
// OffsetForLeaderEpoch, OffsetFetch) ask for a real topic's partitions
// once however many of the client's names read it: the partitions of a
// second name are merged into the first's (a broker answers a partition
// named twice with INVALID_REQUEST, or once), and the answer is handed to
// each name for the partitions it asked. A partition a second name asks
// with other arguments (ListOffsets at another timestamp,
// OffsetForLeaderEpoch at another epoch) cannot ride in the same request:
// that name's partition is answered INVALID_REQUEST, as a broker answers
// a partition named twice, and counted (rtproxy_proxy_view_refused_total).

// multiName is one name a real topic was asked by in such a request.
type multiName struct {
	client  string
	parts   map[int32]bool // asked, and sent
	refused []int32        // asked with other arguments than the first name's
}

// mergeNames renames the topics of a request to the real topics their
// names read and merges a real topic's partitions under one topic; it
// reports whether any topic names a view. scope keys the names (the
// group of an OffsetFetch v8+).
func mergeNames[T, P any](vr *viewReq, scope string, topics []T, name func(*T) *string, partsOf func(*T) *[]P,
	partOf func(*P) int32, same func(a, b *P) bool) ([]T, bool) {
	anyView := false
	for i := range topics {
		if v := vr.views.Lookup(*name(&topics[i]), vr.client); v != nil {
			anyView = true
			break
		}
	}
	if !anyView {
		return topics, false
	}
	if vr.multi == nil {
		vr.multi = map[string][]*multiName{}
	}
	out := make([]T, 0, len(topics))
	at := map[string]int{}
	for _, t := range topics {
		client := *name(&t)
		real := client
		if v := vr.views.Lookup(client, vr.client); v != nil {
			real = v.Topic()
		}
		key := scope + "\x00" + real
		var mn *multiName
		for _, prev := range vr.multi[key] {
			if prev.client == client {
				mn = prev
			}
		}
		if mn == nil {
			mn = &multiName{client: client, parts: map[int32]bool{}}
			vr.multi[key] = append(vr.multi[key], mn)
		}
		i, seen := at[key]
		if !seen {
			*name(&t) = real
			for _, p := range *partsOf(&t) {
				mn.parts[partOf(&p)] = true
			}
			at[key] = len(out)
			out = append(out, t)
			continue
		}
		dst := partsOf(&out[i])
	parts:
		for _, p := range *partsOf(&t) {
			for j := range *dst {
				q := &(*dst)[j]
				if partOf(q) != partOf(&p) {
					continue
				}
				if same(q, &p) {
					mn.parts[partOf(&p)] = true
				} else {
					mn.refused = append(mn.refused, partOf(&p))
				}
				continue parts
			}
			*dst = append(*dst, p)
			mn.parts[partOf(&p)] = true
		}
	}
	return out, true
}

// fanNames hands each real topic of an answer to the names it was asked
// by (mergeNames); refuse makes the answer for a refused partition.
func fanNames[T, P any](vr *viewReq, scope string, topics []T, name func(*T) *string, partsOf func(*T) *[]P,
	partOf func(*P) int32, refuse func(int32) P) []T {
	if vr.multi == nil {
		return topics
	}
	out := make([]T, 0, len(topics))
	for _, t := range topics {
		names := vr.multi[scope+"\x00"+*name(&t)]
		if len(names) == 0 {
			out = append(out, t)
			continue
		}
		for _, mn := range names {
			nt := t
			*name(&nt) = mn.client
			var ps []P
			for _, p := range *partsOf(&t) {
				if mn.parts[partOf(&p)] {
					ps = append(ps, p)
				}
			}
			for _, p := range mn.refused {
				ps = append(ps, refuse(p))
			}
			*partsOf(&nt) = ps
			out = append(out, nt)
		}
	}
	return out
}

// A group keeps one committed offset per real partition, and the offsets
// of a view are kept under its real topic (OffsetCommit): one commit that
// names a real topic under two names (a topic and its view, two views of
// one topic) cannot keep both. The later names' partitions are taken out
// of the request and answered INVALID_TOPIC_EXCEPTION, counted and logged.
// (One group should not consume a topic and a view of it: docs/RULES.md.)

// commitRefusal is a topic taken out of a commit.
type commitRefusal struct {
	name  string
	id    [16]byte
	parts []int32
}

// splitCommit takes out of a commit's topics those that name a real topic
// already named under another name.
func splitCommit[T any](pr *pair, vr *viewReq, st *viewConn, topics []T, byID bool, ref func(*T) (*string, *[16]byte),
	parts func(*T) []int32) []T {
	seen := map[string]string{}
	kept := topics[:0]
	for _, t := range topics {
		name, id := ref(&t)
		client, ok := pr.resolveName(st, *name, *id, byID)
		if !ok {
			kept = append(kept, t)
			continue
		}
		real := client
		if v := vr.views.Lookup(client, vr.client); v != nil {
			real = v.Topic()
		}
		if prev, dup := seen[real]; dup && prev != client {
			vr.commitRefused = append(vr.commitRefused, commitRefusal{name: client, id: *id, parts: parts(&t)})
			pr.p.vm.refused.WithLabelValues("OffsetCommit").Inc()
			pr.p.log.Warn("refused a commit naming one topic under two names", "topic", client, "also", prev, "real", real,
				"client", pr.clientAddr, "client_id", vr.client.ClientID)
			continue
		}
		seen[real] = client
		kept = append(kept, t)
	}
	return kept
}
