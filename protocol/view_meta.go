package protocol

// Metadata through views: a virtual topic that applies to the client is
// listed with the real topic's partitions, leaders, replicas and error
// (brokers rewritten as for every Metadata response) under its own name
// and id (viewTopicID, derived from its name). A request naming virtual
// topics asks the brokers for their real ones instead; the real topic is
// then left out of the answer unless the client asked for it too. A
// request for all topics lists the client's virtual topics as well. A
// view in place (on the real topic's name) changes nothing here.

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// metaView is what a Metadata response needs.
type metaView struct {
	all       bool              // the client asked for every topic
	asked     map[string]string // virtual topics asked for -> their real topics
	askedReal map[string]bool   // real topics the client asked for itself
	order     []string          // the virtual topics in the order asked
}

func (pr *pair) viewMetadataRequest(vr *viewReq, st *viewConn, r *kmsg.MetadataRequest) bool {
	mv := &metaView{asked: map[string]string{}, askedReal: map[string]bool{}}
	vr.meta = mv
	if r.Topics == nil || (r.Version == 0 && len(r.Topics) == 0) {
		mv.all = true
		return len(st.virt) > 0
	}
	kept := r.Topics[:0]
	seen := map[string]bool{}
	var zero [16]byte
	for _, t := range r.Topics {
		name := ""
		if t.Topic != nil {
			name = *t.Topic
		} else if t.TopicID != zero {
			n, ok := pr.resolveName(st, "", t.TopicID, true)
			if !ok {
				kept = append(kept, t)
				continue
			}
			name = n
		}
		if v := vr.views.Lookup(name, vr.client); v != nil && v.Topic() != name {
			real := v.Topic()
			if _, dup := mv.asked[name]; !dup {
				mv.order = append(mv.order, name)
			}
			mv.asked[name] = real
			if !seen[real] {
				seen[real] = true
				kept = append(kept, kmsg.MetadataRequestTopic{Topic: kmsg.StringPtr(real)})
			}
			continue
		}
		if t.Topic != nil {
			mv.askedReal[name] = true
			if seen[name] {
				continue
			}
			seen[name] = true
		}
		kept = append(kept, t)
	}
	r.Topics = kept
	return len(mv.asked) > 0
}

func (p *Proxy) viewMetadataResponse(vr *viewReq, resp *kmsg.MetadataResponse) {
	mv := vr.meta
	if mv == nil {
		return
	}
	idx := make(map[string]int, len(resp.Topics))
	for i, t := range resp.Topics {
		if t.Topic != nil {
			idx[*t.Topic] = i
		}
	}
	virtual := func(name, real string) (kmsg.MetadataResponseTopic, bool) {
		i, ok := idx[real]
		if !ok {
			return kmsg.MetadataResponseTopic{}, false
		}
		t := resp.Topics[i]
		t.Topic = kmsg.StringPtr(name)
		t.TopicID = viewTopicID(name)
		t.IsInternal = false
		return t, true
	}
	if mv.all {
		for name, real := range vr.views.Virtual(vr.client) {
			if t, ok := virtual(name, real); ok {
				resp.Topics = append(resp.Topics, t)
			}
		}
		return
	}
	var add []kmsg.MetadataResponseTopic
	for _, name := range mv.order {
		t, ok := virtual(name, mv.asked[name])
		if !ok {
			t = kmsg.NewMetadataResponseTopic()
			t.Topic = kmsg.StringPtr(name)
			t.TopicID = viewTopicID(name)
			t.ErrorCode = kerr.UnknownTopicOrPartition.Code
		}
		add = append(add, t)
	}
	kept := resp.Topics[:0]
	for _, t := range resp.Topics {
		if t.Topic != nil && !mv.askedReal[*t.Topic] {
			isReal := false
			for _, real := range mv.asked {
				isReal = isReal || real == *t.Topic
			}
			if isReal {
				continue
			}
		}
		kept = append(kept, t)
	}
	resp.Topics = append(kept, add...)
}
