package protocol

// Views on the wire (view.go holds the seam, Views): who fetches, which
// requests name a view, and the renaming of virtual topics to the real
// ones they read and back.
//
// Without views (SetViews(nil), the default) nothing here runs: the
// request path costs one atomic load. With views, a Fetch request is
// walked without decoding (its topic names or ids) and looked up in a
// per-connection cache, so a client no view applies to stays on the fast
// path (streamed, raw); only a request naming a view, or a fetch session
// that holds one, is decoded, rewritten and its response read whole.
// Metadata, ListOffsets, OffsetCommit, TxnOffsetCommit, OffsetFetch and
// OffsetForLeaderEpoch requests are decoded (they are small and rare) and
// rewritten when they name a virtual topic (a real topic named under
// several names: view_names.go), as are the other requests that name
// topics (view_admin.go: answered from the real topic, or refused); Produce to a virtual topic is
// refused in the proxy (guard.go's refused partitions) with
// INVALID_TOPIC_EXCEPTION and a message, its records never reaching a
// broker.
//
// Who fetches (ViewClient): the request header's client id, the SASL
// principal and the TLS client certificate's subject. The proxy does not
// terminate SASL; it reads the username a client claims as its
// SaslAuthenticate passes (PLAIN's authcid, SCRAM's n= attribute,
// OAUTHBEARER's unverified JWT "sub") and adopts it, as Kafka writes a
// principal ("User:alice"), once the broker answers that round without
// error. A broker serves nothing on a
// connection whose authentication failed, so a principal the proxy holds
// is one the broker accepted the credentials of — but the proxy's reading
// is its own: a broker that maps principals differently (a custom
// principal builder, sasl.oauthbearer.sub.claim.name, GSSAPI realms) may
// call the client something else, and GSSAPI yields no principal here.

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// SetViews sets the views in force; nil removes them all. Each request
// reads the set once, so it sees one set from start to end.
func (p *Proxy) SetViews(v Views) {
	if v == nil {
		p.views.Store(nil)
		return
	}
	p.views.Store(&v)
}

// viewTopicID is a virtual topic's id: derived from its name, so every
// proxy instance and every restart gives the same one.
func viewTopicID(name string) [16]byte {
	s := sha256.Sum256([]byte("rtproxy view topic\x00" + name))
	var id [16]byte
	copy(id[:], s[:16])
	return id
}

// noViews stands for a set with no view (views removed while a fetch
// session still holds view topics).
type noViews struct{}

func (noViews) Lookup(string, ViewClient) View       { return nil }
func (noViews) Virtual(ViewClient) map[string]string { return nil }

func orViews(vs *Views) Views {
	if vs == nil {
		return noViews{}
	}
	return *vs
}

// viewConn is a connection's view state, used by clientLoop only.
type viewConn struct {
	set    *Views // the set the caches below were built for
	client ViewClient
	// virt are the client's virtual topics (name -> real topic), byID
	// their ids; hit caches, per topic name or id a client fetches,
	// whether a view applies.
	virt  map[string]string
	byID  map[[16]byte]string
	hit   map[string]bool
	hitID map[[16]byte]bool
	// sess are the topics of the connection's fetch session (KIP-227)
	// by client name, with the real topic each reads and its partitions,
	// while the session holds a view topic (nil otherwise, and when the
	// proxy did not see the session start): an incremental fetch names
	// only what changed, and the response may carry any topic of the
	// session.
	sess map[string]*sessTopic
	// fresh: the view set (or who the client is) changed since the
	// connection's last fetch; a fetch session opened before holds topics
	// under what the old set made of them (view_names.go).
	fresh bool
	// cgSubs are the KIP-848 subscriptions of the connection's members
	// to virtual topics, by group: real topic -> the view's name.
	cgSubs map[string]map[string]string
	// saslMech is the mechanism of the last SaslHandshake.
	saslMech string
	// software is the client software name ApiVersions v3+ declared
	// (KIP-511). Clients that send one (franz-go, librdkafka, the Java
	// client, sarama) read batches of no records; those that do not
	// include kafka-python 2.0.2 and segmentio/kafka-go, which fail on
	// them (view_batch.go).
	software string
}

// viewClient returns who is fetching, refreshing the caches when the
// client's identity or the view set changed.
func (pr *pair) viewClient(vs *Views, h RequestHeader) (Views, *viewConn) {
	st := &pr.vs
	principal := ""
	if p := pr.principal.Load(); p != nil {
		principal = *p
	}
	if st.set != vs || string(h.ClientID) != st.client.ClientID || principal != st.client.Principal || st.virt == nil {
		st.set, st.fresh = vs, true
		st.client = ViewClient{ClientID: string(h.ClientID), Principal: principal, TLSSubject: pr.tlsSubject}
		set := orViews(vs)
		st.virt = set.Virtual(st.client)
		if st.virt == nil {
			st.virt = map[string]string{}
		}
		st.byID = make(map[[16]byte]string, len(st.virt))
		for name := range st.virt {
			st.byID[viewTopicID(name)] = name
		}
		st.hit = map[string]bool{}
		st.hitID = map[[16]byte]bool{}
	}
	return orViews(vs), st
}

// sessTopic is one topic of a fetch session as the proxy follows it.
type sessTopic struct {
	real  string
	view  bool // a view's name (virtual or in place), not the real topic as stored
	parts map[int32]struct{}
}

// viewReq is what a response to a request that named a view needs.
type viewReq struct {
	views  Views
	client ViewClient
	// byReal maps the real topics of the request (and of its fetch
	// session) to the names the client used; byRealID the same by id.
	byReal   map[string]string
	byRealID map[[16]byte]string
	// meta is set for Metadata.
	meta *metaView
	// fan is set for a Fetch that names one real topic under several
	// names (view_names.go): by real topic (its name, or its id's 16
	// bytes from v13 on), the names it was asked under.
	fan map[string]*fanTopic
	// multi is set for ListOffsets, OffsetForLeaderEpoch and OffsetFetch
	// naming a view: by scope and real topic, the names it was asked by.
	multi map[string][]*multiName
	// commitRefused are the topics taken out of an OffsetCommit or
	// TxnOffsetCommit (view_names.go).
	commitRefused []commitRefusal
	// allOffsets are the client's virtual topics (name -> real topic)
	// for an OffsetFetch of every topic of a group.
	allOffsets map[string]string
	allGroups  []string // the groups asked for every topic (v8+)
	// admin is set for the other requests that name topics (view_admin.go).
	admin *viewAdmin
	// Fetch: emptyOK when the client can read a batch of no records;
	// maxWait is the request's; delay holds the response (delayIfEmpty).
	emptyOK bool
	maxWait time.Duration
	delay   time.Duration
}

func newViewReq(vs Views, c ViewClient) *viewReq {
	return &viewReq{views: vs, client: c, byReal: map[string]string{}, byRealID: map[[16]byte]string{}}
}

// resolve returns the client name of a topic named by name or, when
// byID, by id: a virtual id of the client's views, or a real one the
// proxy learnt from metadata.
func (pr *pair) resolveName(st *viewConn, name string, id [16]byte, byID bool) (string, bool) {
	if !byID {
		return name, true
	}
	if n, ok := st.byID[id]; ok {
		return n, true
	}
	return pr.p.TopicName(id)
}

// toReal renames one topic reference of a request from the client's
// name to the real topic's, recording the way back; it reports whether
// the reference names a view (virtual or in place).
func (pr *pair) toReal(vr *viewReq, st *viewConn, name *string, id *[16]byte, byID bool) bool {
	client, ok := pr.resolveName(st, *name, *id, byID)
	if !ok {
		return false
	}
	v := vr.views.Lookup(client, vr.client)
	if v == nil {
		return false
	}
	real := v.Topic()
	if byID {
		rid, ok := pr.p.topicID(real)
		if !ok {
			// The real topic's id is not known yet (no metadata for it
			// passed): the broker answers UNKNOWN_TOPIC_ID for the
			// virtual id, and the client refreshes its metadata.
			return true
		}
		if prev, dup := vr.byRealID[rid]; dup && prev != client {
			return true // a second name for one real topic: left to fail at the broker
		}
		*id = rid
		vr.byRealID[rid] = client
	} else {
		if prev, dup := vr.byReal[real]; dup && prev != client {
			return true
		}
		*name = real
	}
	vr.byReal[real] = client
	return true
}

// toClient renames one topic reference of a response back to the name
// (or id) the client used; it returns the client's name ("" when the
// topic was not renamed).
func (vr *viewReq) toClient(name *string, id *[16]byte, byID bool) string {
	if byID {
		c, ok := vr.byRealID[*id]
		if !ok {
			return ""
		}
		if real, ok := vr.realOf(c); ok && real != c {
			*id = viewTopicID(c)
		}
		return c
	}
	c, ok := vr.byReal[*name]
	if !ok {
		return ""
	}
	*name = c
	return c
}

func (vr *viewReq) realOf(client string) (string, bool) {
	for r, c := range vr.byReal {
		if c == client {
			return r, true
		}
	}
	return "", false
}

// viewKeys are the requests that name topics a view may stand for.
func viewKey(key int16) bool {
	switch kmsg.Key(key) {
	case kmsg.Fetch, kmsg.Metadata, kmsg.ListOffsets, kmsg.OffsetCommit, kmsg.TxnOffsetCommit,
		kmsg.OffsetFetch, kmsg.OffsetForLeaderEpoch:
		return true
	}
	return viewAdminKey(key)
}

// viewRequest rewrites a request that names a view (virtual topics to
// their real ones) and returns the frame to forward with what the
// response needs (nil: the request names no view, forwarded as it is).
// frame holds the request's head, rest bytes are still unread; a request
// that must be looked at is read whole.
func (pr *pair) viewRequest(vsp *Views, h RequestHeader, frame []byte, rest int) ([]byte, int, *viewReq, error) {
	if !viewKey(h.APIKey) {
		return frame, rest, nil, nil
	}
	vs, st := pr.viewClient(vsp, h)
	if h.APIKey == int16(kmsg.Fetch) && len(st.sess) == 0 && !st.fresh && rest == 0 &&
		!pr.fetchNamesView(vs, st, h, frame[4+h.BodyOffset:]) {
		return frame, rest, nil, nil // the fast path: no view in this fetch
	}
	if rest > 0 {
		n, ok := pr.p.held.acquire(int64(len(frame)+rest), pr.done)
		if !ok {
			ReleaseFrame(frame)
			return nil, 0, nil, errors.New("connection closed")
		}
		var err error
		frame, err = completeFrame(pr.client, frame, rest)
		pr.p.held.release(n)
		if err != nil {
			return nil, 0, nil, err
		}
		rest = 0
	}
	req := kmsg.RequestForKey(h.APIKey)
	req.SetVersion(h.APIVersion)
	if err := req.ReadFrom(frame[4+h.BodyOffset:]); err != nil {
		ReleaseFrame(frame)
		return nil, 0, nil, fmt.Errorf("%w: %s v%d request does not decode: %v", ErrBadHeader, kmsg.NameForKey(h.APIKey), h.APIVersion, err)
	}
	vr := newViewReq(vs, st.client)
	changed := false
	switch r := req.(type) {
	case *kmsg.FetchRequest:
		changed = pr.viewFetchRequest(vr, st, r)
	case *kmsg.MetadataRequest:
		changed = pr.viewMetadataRequest(vr, st, r)
	case *kmsg.ListOffsetsRequest:
		r.Topics, changed = mergeNames(vr, "", r.Topics, func(t *kmsg.ListOffsetsRequestTopic) *string { return &t.Topic },
			func(t *kmsg.ListOffsetsRequestTopic) *[]kmsg.ListOffsetsRequestTopicPartition { return &t.Partitions },
			func(p *kmsg.ListOffsetsRequestTopicPartition) int32 { return p.Partition },
			func(a, b *kmsg.ListOffsetsRequestTopicPartition) bool {
				return a.Timestamp == b.Timestamp && a.MaxNumOffsets == b.MaxNumOffsets
			})
	case *kmsg.OffsetForLeaderEpochRequest:
		r.Topics, changed = mergeNames(vr, "", r.Topics, func(t *kmsg.OffsetForLeaderEpochRequestTopic) *string { return &t.Topic },
			func(t *kmsg.OffsetForLeaderEpochRequestTopic) *[]kmsg.OffsetForLeaderEpochRequestTopicPartition {
				return &t.Partitions
			},
			func(p *kmsg.OffsetForLeaderEpochRequestTopicPartition) int32 { return p.Partition },
			func(a, b *kmsg.OffsetForLeaderEpochRequestTopicPartition) bool { return a.LeaderEpoch == b.LeaderEpoch })
	case *kmsg.OffsetCommitRequest:
		r.Topics = splitCommit(pr, vr, st, r.Topics, r.Version >= 10, func(t *kmsg.OffsetCommitRequestTopic) (*string, *[16]byte) { return &t.Topic, &t.TopicID },
			func(t *kmsg.OffsetCommitRequestTopic) []int32 {
				ps := make([]int32, 0, len(t.Partitions))
				for _, p := range t.Partitions {
					ps = append(ps, p.Partition)
				}
				return ps
			})
		changed = len(vr.commitRefused) > 0
		for i := range r.Topics {
			t := &r.Topics[i]
			changed = pr.toReal(vr, st, &t.Topic, &t.TopicID, r.Version >= 10) || changed
		}
	case *kmsg.TxnOffsetCommitRequest:
		r.Topics = splitCommit(pr, vr, st, r.Topics, r.Version >= 6, func(t *kmsg.TxnOffsetCommitRequestTopic) (*string, *[16]byte) { return &t.Topic, &t.TopicID },
			func(t *kmsg.TxnOffsetCommitRequestTopic) []int32 {
				ps := make([]int32, 0, len(t.Partitions))
				for _, p := range t.Partitions {
					ps = append(ps, p.Partition)
				}
				return ps
			})
		changed = len(vr.commitRefused) > 0
		for i := range r.Topics {
			t := &r.Topics[i]
			changed = pr.toReal(vr, st, &t.Topic, &t.TopicID, r.Version >= 6) || changed
		}
	case *kmsg.OffsetFetchRequest:
		var named bool
		r.Topics, changed = mergeNames(vr, "", r.Topics, func(t *kmsg.OffsetFetchRequestTopic) *string { return &t.Topic },
			func(t *kmsg.OffsetFetchRequestTopic) *[]int32 { return &t.Partitions },
			func(p *int32) int32 { return *p }, func(a, b *int32) bool { return true })
		if len(st.virt) > 0 {
			// Every topic of a group: the client's virtual topics are
			// listed too, with the offsets of the real topics they read
			// (as Metadata lists both).
			for _, g := range r.Groups {
				if g.Topics == nil {
					vr.allGroups = append(vr.allGroups, g.Group)
				}
			}
			if (r.Version < 8 && r.Topics == nil) || len(vr.allGroups) > 0 {
				vr.allOffsets, changed = st.virt, true
			}
		}
		for g := range r.Groups {
			if r.Version >= 10 { // by topic id
				for i := range r.Groups[g].Topics {
					t := &r.Groups[g].Topics[i]
					changed = pr.toReal(vr, st, &t.Topic, &t.TopicID, true) || changed
				}
				continue
			}
			gr := &r.Groups[g]
			gr.Topics, named = mergeNames(vr, gr.Group, gr.Topics, func(t *kmsg.OffsetFetchRequestGroupTopic) *string { return &t.Topic },
				func(t *kmsg.OffsetFetchRequestGroupTopic) *[]int32 { return &t.Partitions },
				func(p *int32) int32 { return *p }, func(a, b *int32) bool { return true })
			changed = changed || named
		}
	}
	if viewAdminKey(h.APIKey) {
		changed = pr.viewAdminRequest(vr, st, req)
	}
	if !changed {
		return frame, 0, nil, nil
	}
	out := getBuf(4 + h.BodyOffset)[:0]
	out = append(out, frame[:4+h.BodyOffset]...)
	out = req.AppendTo(out)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	ReleaseFrame(frame)
	return out, 0, vr, nil
}

// viewResponse rewrites the response (frame, whole) to a request that
// named a view: real topics back to the client's names, and for Fetch
// the records through the views. nil: forward frame as it is.
func (pr *pair) viewResponse(req inflight, frame []byte) ([]byte, error) {
	off, err := responseBodyOffset(frame[4:], req.key, req.version)
	if err != nil {
		return nil, fmt.Errorf("response header: %w", err)
	}
	hdrEnd := 4 + off
	r, err := decodeResponse(req.key, req.version, frame[hdrEnd:])
	if err != nil {
		return nil, err
	}
	vr := req.view
	switch resp := r.(type) {
	case *kmsg.FetchResponse:
		if _, err = pr.p.viewFetchResponse(vr, resp, pr.done); err != nil {
			return nil, err
		}
	case *kmsg.MetadataResponse:
		pr.p.viewMetadataResponse(vr, resp)
	case *kmsg.ListOffsetsResponse:
		resp.Topics = fanNames(vr, "", resp.Topics, func(t *kmsg.ListOffsetsResponseTopic) *string { return &t.Topic },
			func(t *kmsg.ListOffsetsResponseTopic) *[]kmsg.ListOffsetsResponseTopicPartition { return &t.Partitions },
			func(p *kmsg.ListOffsetsResponseTopicPartition) int32 { return p.Partition },
			func(p int32) kmsg.ListOffsetsResponseTopicPartition {
				pr.p.vm.refused.WithLabelValues("ListOffsets").Inc()
				rp := kmsg.NewListOffsetsResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p, kerr.InvalidRequest.Code
				return rp
			})
	case *kmsg.OffsetForLeaderEpochResponse:
		resp.Topics = fanNames(vr, "", resp.Topics, func(t *kmsg.OffsetForLeaderEpochResponseTopic) *string { return &t.Topic },
			func(t *kmsg.OffsetForLeaderEpochResponseTopic) *[]kmsg.OffsetForLeaderEpochResponseTopicPartition {
				return &t.Partitions
			},
			func(p *kmsg.OffsetForLeaderEpochResponseTopicPartition) int32 { return p.Partition },
			func(p int32) kmsg.OffsetForLeaderEpochResponseTopicPartition {
				pr.p.vm.refused.WithLabelValues("OffsetForLeaderEpoch").Inc()
				rp := kmsg.NewOffsetForLeaderEpochResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p, kerr.InvalidRequest.Code
				return rp
			})
	case *kmsg.OffsetCommitResponse:
		for i := range resp.Topics {
			t := &resp.Topics[i]
			vr.toClient(&t.Topic, &t.TopicID, resp.Version >= 10)
		}
		for _, c := range vr.commitRefused {
			t := kmsg.NewOffsetCommitResponseTopic()
			t.Topic, t.TopicID = c.name, c.id
			for _, p := range c.parts {
				t.Partitions = append(t.Partitions, kmsg.OffsetCommitResponseTopicPartition{Partition: p, ErrorCode: kerr.InvalidTopicException.Code})
			}
			resp.Topics = append(resp.Topics, t)
		}
	case *kmsg.TxnOffsetCommitResponse:
		for i := range resp.Topics {
			t := &resp.Topics[i]
			vr.toClient(&t.Topic, &t.TopicID, resp.Version >= 6)
		}
		for _, c := range vr.commitRefused {
			t := kmsg.NewTxnOffsetCommitResponseTopic()
			t.Topic, t.TopicID = c.name, c.id
			for _, p := range c.parts {
				t.Partitions = append(t.Partitions, kmsg.TxnOffsetCommitResponseTopicPartition{Partition: p, ErrorCode: kerr.InvalidTopicException.Code})
			}
			resp.Topics = append(resp.Topics, t)
		}
	case *kmsg.OffsetFetchResponse:
		pr.allOffsets(vr, resp)
		resp.Topics = fanNames(vr, "", resp.Topics, func(t *kmsg.OffsetFetchResponseTopic) *string { return &t.Topic },
			func(t *kmsg.OffsetFetchResponseTopic) *[]kmsg.OffsetFetchResponseTopicPartition { return &t.Partitions },
			func(p *kmsg.OffsetFetchResponseTopicPartition) int32 { return p.Partition }, nil)
		for g := range resp.Groups {
			gr := &resp.Groups[g]
			if resp.Version >= 10 {
				for i := range gr.Topics {
					t := &gr.Topics[i]
					vr.toClient(&t.Topic, &t.TopicID, true)
				}
				continue
			}
			gr.Topics = fanNames(vr, gr.Group, gr.Topics, func(t *kmsg.OffsetFetchResponseGroupTopic) *string { return &t.Topic },
				func(t *kmsg.OffsetFetchResponseGroupTopic) *[]kmsg.OffsetFetchResponseGroupTopicPartition {
					return &t.Partitions
				},
				func(p *kmsg.OffsetFetchResponseGroupTopicPartition) int32 { return p.Partition }, nil)
		}
	}
	if vr.admin != nil {
		pr.viewAdminResponse(vr, r)
	}
	out := getBuf(len(frame) + len(frame)/16)[:0]
	out = append(out, frame[:hdrEnd]...)
	out = r.AppendTo(out)
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out, nil
}

// allOffsets adds the client's virtual topics to the answer to an
// OffsetFetch of every topic of a group, with the offsets of the real
// topics they read.
func (pr *pair) allOffsets(vr *viewReq, resp *kmsg.OffsetFetchResponse) {
	if len(vr.allOffsets) == 0 {
		return
	}
	names := slices.Sorted(maps.Keys(vr.allOffsets))
	if resp.Version < 8 {
		n := len(resp.Topics)
		for _, name := range names {
			for _, t := range resp.Topics[:n] {
				if t.Topic == vr.allOffsets[name] {
					t.Topic = name
					resp.Topics = append(resp.Topics, t)
				}
			}
		}
		return
	}
	for g := range resp.Groups {
		gr := &resp.Groups[g]
		if !slices.Contains(vr.allGroups, gr.Group) {
			continue
		}
		n := len(gr.Topics)
		for _, name := range names {
			real := vr.allOffsets[name]
			for _, t := range gr.Topics[:n] {
				if resp.Version >= 10 {
					if rn, ok := pr.p.TopicName(t.TopicID); !ok || rn != real {
						continue
					}
					t.TopicID = viewTopicID(name)
				} else if t.Topic != real {
					continue
				}
				t.Topic = name
				gr.Topics = append(gr.Topics, t)
			}
		}
	}
}

// viewRefuses reports whether a Produce to topic (the client's name, or
// id) must be refused: it names a virtual topic of a view that applies to
// the client.
func (pr *pair) viewRefuses(name string, id [16]byte, byID bool) (string, bool) {
	if pr.vs.set == nil && pr.vs.virt == nil {
		return "", false
	}
	if byID {
		if n, ok := pr.vs.byID[id]; ok {
			return n, true
		}
		return "", false
	}
	if _, ok := pr.vs.virt[name]; ok {
		return name, true
	}
	if pr.vs.set == nil {
		return "", false
	}
	if v := (*pr.vs.set).Lookup(name, pr.vs.client); v != nil && v.Topic() != name {
		return name, true
	}
	return "", false
}

// viewRefusal is the answer to a produce to a virtual topic.
func viewRefusal(topic string, id [16]byte, partition int32) refusedPart {
	return refusedPart{topic: topic, topicID: id, partition: partition, code: kerr.InvalidTopicException.Code,
		message: fmt.Sprintf("rtproxy: %q is a view (a read-only virtual topic); produce to the topic it reads", topic)}
}

// noteSASL reads the mechanism of a SaslHandshake, the client software
// name of an ApiVersions v3+, and the username a SaslAuthenticate claims
// (see the package comment above); the latter is adopted when the broker
// accepts the round (adoptPrincipal).
func (pr *pair) noteSASL(h RequestHeader, frame []byte, rest int) string {
	if rest > 0 {
		return ""
	}
	body := frame[4+h.BodyOffset:]
	switch h.APIKey {
	case int16(kmsg.SASLHandshake):
		r := kmsg.NewPtrSASLHandshakeRequest()
		r.SetVersion(h.APIVersion)
		if r.ReadFrom(body) == nil {
			pr.vs.saslMech = r.Mechanism
		}
	case int16(kmsg.ApiVersions):
		if h.APIVersion >= 3 {
			r := kmsg.NewPtrApiVersionsRequest()
			r.SetVersion(h.APIVersion)
			if r.ReadFrom(body) == nil {
				pr.vs.software = r.ClientSoftwareName
			}
		}
	case int16(kmsg.SASLAuthenticate):
		r := kmsg.NewPtrSASLAuthenticateRequest()
		r.SetVersion(h.APIVersion)
		if r.ReadFrom(body) == nil {
			return saslUsername(pr.vs.saslMech, r.SASLAuthBytes)
		}
	}
	return ""
}

// adoptPrincipal sets the connection's principal when the broker's
// SaslAuthenticate response (frame, whole) has no error.
func (pr *pair) adoptPrincipal(req inflight, frame []byte) {
	off, err := responseBodyOffset(frame[4:], req.key, req.version)
	if err != nil || len(frame) < 4+off+2 {
		return
	}
	if binary.BigEndian.Uint16(frame[4+off:]) == 0 {
		u := "User:" + req.saslUser // as Kafka writes a principal (KafkaPrincipal, ACLs)
		pr.principal.Store(&u)
	}
}

// saslUsername is the username a client's SASL message claims, or "".
func saslUsername(mech string, b []byte) string {
	switch {
	case mech == "PLAIN":
		// [authzid] NUL authcid NUL passwd
		parts := bytes.SplitN(b, []byte{0}, 3)
		if len(parts) == 3 {
			return string(parts[1])
		}
	case strings.HasPrefix(mech, "SCRAM-"):
		// client-first-message: gs2-header "n,," then n=user,r=nonce
		s := string(b)
		if i := strings.Index(s, "n="); i >= 0 && strings.Count(s[:i], ",") == 2 {
			u := s[i+2:]
			if j := strings.IndexByte(u, ','); j >= 0 {
				u = u[:j]
			}
			return strings.NewReplacer("=2C", ",", "=3D", "=").Replace(u)
		}
	case mech == "OAUTHBEARER":
		for _, kv := range strings.Split(string(b), "\x01") {
			tok, ok := strings.CutPrefix(kv, "auth=Bearer ")
			if !ok {
				continue
			}
			parts := strings.Split(tok, ".")
			if len(parts) != 3 {
				return ""
			}
			payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
			if err != nil {
				return ""
			}
			var claims struct {
				Sub string `json:"sub"`
			}
			if json.Unmarshal(payload, &claims) == nil {
				return claims.Sub
			}
		}
	}
	return ""
}
