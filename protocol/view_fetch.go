package protocol

// Fetch through views: the request's virtual topics are renamed to the
// real ones (by name before v13, by id from v13 on), the fetch session's
// view topics are remembered by the client's names (an incremental fetch
// names only what changed), and the response's partitions of view topics
// have their records rewritten (view_batch.go) and their topics renamed
// back. The response is read whole: the request's MaxBytes is capped to a
// quarter of proxy.max_held_bytes, and the response and its rewrite are
// both counted against it (conn.go).

import (
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fetchNamesView walks a Fetch request body without decoding it and
// reports whether one of its topics has a view for the client (a body it
// cannot walk reports true: the decoder then says what is wrong).
func (pr *pair) fetchNamesView(vs Views, st *viewConn, h RequestHeader, body []byte) bool {
	v := h.APIVersion
	flex := v >= 12
	w := reqWalker{skipper: skipper{p: body}, flex: flex}
	if v < 15 {
		w.skip(4) // replica id
	}
	w.skip(4 + 4) // max wait, min bytes
	if v >= 3 {
		w.skip(4)
	}
	if v >= 4 {
		w.skip(1)
	}
	if v >= 7 {
		w.skip(8)
	}
	for t := w.array(); t > 0 && !w.bad; t-- {
		if v >= 13 {
			var id [16]byte
			if !w.bad && len(w.p)-w.off >= 16 {
				copy(id[:], w.p[w.off:])
			}
			w.skip(16)
			if w.bad {
				break
			}
			hit, ok := st.hitID[id]
			if !ok {
				if n, known := pr.resolveName(st, "", id, true); known {
					hit = vs.Lookup(n, st.client) != nil
				}
				st.hitID[id] = hit
			}
			if hit {
				return true
			}
		} else {
			name := w.str()
			if w.bad {
				break
			}
			hit, ok := st.hit[string(name)]
			if !ok {
				hit = vs.Lookup(string(name), st.client) != nil
				st.hit[string(name)] = hit
			}
			if hit {
				return true
			}
		}
		per := 4 + 8 + 4 // partition, fetch offset, partition max bytes
		if v >= 9 {
			per += 4
		}
		if v >= 12 {
			per += 4
		}
		if v >= 5 {
			per += 8
		}
		for p := w.array(); p > 0 && !w.bad; p-- {
			w.skip(per)
			w.tags()
		}
		w.tags()
	}
	return w.bad
}

// reqWalker walks a request body, flexible or not.
type reqWalker struct {
	skipper
	flex bool
}

func (w *reqWalker) array() int {
	if w.flex {
		return w.arrayLen()
	}
	if w.bad || len(w.p)-w.off < 4 {
		w.bad = true
		return 0
	}
	n := int(int32(uint32(w.p[w.off])<<24 | uint32(w.p[w.off+1])<<16 | uint32(w.p[w.off+2])<<8 | uint32(w.p[w.off+3])))
	w.off += 4
	if n > len(w.p)-w.off {
		w.bad = true
		return 0
	}
	return n
}

func (w *reqWalker) str() []byte {
	n := 0
	if w.flex {
		n = w.compactLen()
	} else {
		if w.bad || len(w.p)-w.off < 2 {
			w.bad = true
			return nil
		}
		n = int(int16(uint16(w.p[w.off])<<8 | uint16(w.p[w.off+1])))
		w.off += 2
	}
	if w.bad || n < 0 || n > len(w.p)-w.off {
		w.bad = true
		return nil
	}
	s := w.p[w.off : w.off+n]
	w.off += n
	return s
}

func (w *reqWalker) tags() {
	if w.flex {
		w.skipper.tags()
	}
}

// viewFetchRequest renames a Fetch request's view topics and records its
// session's; it reports whether the response has view topics. A request
// that would put one real topic under two names into one fetch, or into
// one fetch session, is sent without a session (view_names.go).
func (pr *pair) viewFetchRequest(vr *viewReq, st *viewConn, r *kmsg.FetchRequest) bool {
	byID := r.Version >= 13
	full := r.Version < 7 || r.SessionEpoch <= 0
	vr.emptyOK = st.software != ""
	if pr.fetchCollides(vr, st, r, full) {
		pr.fanFetchRequest(vr, st, r)
		vr.capFetch(pr.p.cfg.MaxHeldBytes, r)
		return true
	}
	if full {
		st.sess = nil // a full fetch: the session (if any) is what it names
	}
	for i := range r.ForgottenTopics {
		t := &r.ForgottenTopics[i]
		client, ok := pr.resolveName(st, t.Topic, t.TopicID, byID)
		if !ok {
			continue
		}
		s, in := st.sess[client]
		if !in {
			continue
		}
		for _, p := range t.Partitions {
			delete(s.parts, p)
		}
		if len(s.parts) == 0 {
			delete(st.sess, client)
		}
		if !s.view {
			continue
		}
		if byID {
			if rid, ok := pr.p.topicID(s.real); ok {
				t.TopicID = rid
			}
		} else {
			t.Topic = s.real
		}
	}
	for i := range r.Topics {
		t := &r.Topics[i]
		client, known := pr.resolveName(st, t.Topic, t.TopicID, byID)
		isView := pr.toReal(vr, st, &t.Topic, &t.TopicID, byID)
		if !known {
			continue
		}
		real := client
		if isView {
			if v := vr.views.Lookup(client, vr.client); v != nil {
				real = v.Topic()
			}
		}
		if st.sess == nil {
			st.sess = map[string]*sessTopic{}
		}
		s := st.sess[client]
		if s == nil {
			s = &sessTopic{real: real, view: isView, parts: map[int32]struct{}{}}
			st.sess[client] = s
		}
		for _, p := range t.Partitions {
			s.parts[p.Partition] = struct{}{}
		}
	}
	views := 0
	for client, s := range st.sess {
		if !s.view {
			continue
		}
		views++
		if _, ok := vr.byReal[s.real]; ok {
			continue
		}
		vr.byReal[s.real] = client
		if byID {
			if rid, ok := pr.p.topicID(s.real); ok {
				vr.byRealID[rid] = client
			}
		}
	}
	if views == 0 || r.Version < 7 || r.SessionEpoch < 0 {
		st.sess = nil // no view in the session, or no session at all
	}
	vr.capFetch(pr.p.cfg.MaxHeldBytes, r)
	return len(vr.byReal) > 0
}

// capFetch caps the request's byte limits to a quarter of max_held_bytes
// (the response is read whole) and notes what the response needs.
func (vr *viewReq) capFetch(maxHeld int64, r *kmsg.FetchRequest) {
	vr.maxWait = time.Duration(r.MaxWaitMillis) * time.Millisecond
	if maxHeld <= 0 {
		return
	}
	capBytes := int32(min(max(maxHeld/4, 64<<10), 1<<30))
	r.MaxBytes = min(r.MaxBytes, capBytes)
	for i := range r.Topics {
		for j := range r.Topics[i].Partitions {
			pp := &r.Topics[i].Partitions[j]
			pp.PartitionMaxBytes = min(pp.PartitionMaxBytes, capBytes)
		}
	}
}

var viewScratches = sync.Pool{New: func() any { return new(viewScratch) }}

// viewFetchResponse renames the view topics of a Fetch response back and
// rewrites their records. The error is only that the connection closed
// while a decode waited for the global budget.
func (p *Proxy) viewFetchResponse(vr *viewReq, resp *kmsg.FetchResponse, done <-chan struct{}) ([]byte, error) {
	byID := resp.Version >= 13
	sc := viewScratches.Get().(*viewScratch)
	defer viewScratches.Put(sc)
	sc.noEmpty, sc.dropped = !vr.emptyOK, 0
	defer func() { vr.delay = vr.delayIfEmpty(resp, sc.dropped) }()
	if vr.fan != nil {
		return nil, p.fanFetchResponse(vr, resp, done, sc)
	}
	// The view of each topic (nil for a topic no view applies to) and
	// the name its client uses.
	views := make([]View, len(resp.Topics))
	clients := make([]string, len(resp.Topics))
	batches, size := 0, 0
	for ti := range resp.Topics {
		t := &resp.Topics[ti]
		real := t.Topic
		if byID {
			real, _ = p.TopicName(t.TopicID)
		}
		client := vr.toClient(&t.Topic, &t.TopicID, byID)
		if client == "" {
			continue
		}
		v := vr.views.Lookup(client, vr.client)
		if v == nil || v.Topic() != real {
			// The view went away (a reload) while the session held it:
			// its topic no longer exists for this client.
			for pi := range t.Partitions {
				pp := &t.Partitions[pi]
				pp.ErrorCode, pp.RecordBatches = kerr.UnknownTopicOrPartition.Code, nil
			}
			continue
		}
		views[ti], clients[ti] = v, client
		for pi := range t.Partitions {
			eachViewBatch(t.Partitions[pi].RecordBatches, func(b []byte) { batches, size = batches+1, size+len(b) })
		}
	}
	if viewParallel(batches, size) {
		jobs := make([]*viewJob, 0, batches)
		for ti, v := range views {
			if v == nil {
				continue
			}
			for pi := range resp.Topics[ti].Partitions {
				pp := &resp.Topics[ti].Partitions[pi]
				eachViewBatch(pp.RecordBatches, func(b []byte) {
					jobs = append(jobs, &viewJob{v: v, partition: pp.Partition, b: b, done: make(chan struct{})})
				})
			}
		}
		sc.jobs = startViewJobsN(jobs, viewWorkers(batches), p.held, func() *decodeMeter { return p.newMeter(done, p.guardBufs) })
		defer func() { sc.jobs.stop(); sc.jobs = nil }()
	}
	for ti := range resp.Topics {
		t := &resp.Topics[ti]
		v := views[ti]
		if v == nil {
			continue
		}
		client := clients[ti]
		var c viewCounts
		for pi := range t.Partitions {
			pp := &t.Partitions[pi]
			if len(pp.RecordBatches) == 0 {
				continue
			}
			m := p.newMeter(done, p.guardBufs)
			out, err := viewPartition(make([]byte, 0, len(pp.RecordBatches)+len(pp.RecordBatches)/16+128), v, pp.Partition, pp.RecordBatches, m, sc, &c)
			m.endPart()
			if err != nil {
				return nil, err
			}
			pp.RecordBatches = out
		}
		p.vm.count(client, c)
	}
	return nil, nil
}

// delayIfEmpty is how long to hold a fetch response whose partitions hold
// no record at all because the runs of filtered batches at their ends
// were left out (a client that cannot read an empty batch): the client
// would fetch the same offsets again at once, and the broker answer at
// once, a loop as fast as the network; held for the fetch's max wait (at
// most maxEmptyDelay), the client polls as it does at the end of a log.
func (vr *viewReq) delayIfEmpty(resp *kmsg.FetchResponse, dropped int) time.Duration {
	if dropped == 0 {
		return 0
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if len(p.RecordBatches) > 0 {
				return 0
			}
		}
	}
	return min(vr.maxWait, maxEmptyDelay)
}

// maxEmptyDelay bounds delayIfEmpty.
const maxEmptyDelay = 500 * time.Millisecond
