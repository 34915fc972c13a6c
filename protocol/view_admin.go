package protocol

// The other requests that name topics, when they name a view (see the
// table in docs/RULES.md, "Views and the other requests"):
//
//   - read-only ones are answered for the virtual topic from the real one
//     (DescribeTopicPartitions, DescribeConfigs, DescribeProducers), as
//     is OffsetDelete (a group's
//     offsets of a view are kept under the real topic, OffsetCommit);
//   - the ones that change a topic (DeleteTopics, CreatePartitions,
//     DeleteRecords, AlterConfigs, IncrementalAlterConfigs, ElectLeaders,
//     AlterPartitionAssignments, AlterReplicaLogDirs) or add it to a
//     transaction (AddPartitionsToTxn; Produce is refused in guard.go) are
//     refused for a virtual topic: its entries are taken out of the
//     request, so the broker never sees them (nor acts on a real topic
//     that happens to have the view's name), and answered
//     INVALID_TOPIC_EXCEPTION with a message where the answer has room
//     for one; CreateTopics of a virtual topic's name is answered
//     TOPIC_ALREADY_EXISTS (the name is taken, for this client);
//   - KIP-848's ConsumerGroupHeartbeat subscribes to the real topic of a
//     virtual one and the assignment comes back under the view's topic
//     id, so the client fetches it through the view; one member that
//     subscribes to a topic and its view, or to two views of one topic,
//     is refused (a broker assigns a partition once);
//   - share groups (KIP-932) cannot read a view, virtual or in place: a
//     ShareGroupHeartbeat subscribing to one is refused, and ShareFetch
//     and ShareAcknowledge of such a topic are answered
//     INVALID_TOPIC_EXCEPTION for its partitions without reaching the
//     broker (the records would go out as stored).
//
// A refused heartbeat goes to the broker with an empty group id, which
// every broker refuses without touching a group; its answer then says
// why. Every refusal is counted (rtproxy_proxy_view_refused_total{api})
// and logged.

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// viewAdmin is what the response to one of these requests needs.
type viewAdmin struct {
	api     string
	refused []string // the client's names taken out of the request
	// refusedIDs are the ids of refused topics named by id, by name.
	refusedIDs map[string][16]byte
	// described maps a real topic to the names it was asked by
	// (DescribeConfigs).
	described map[string][]string
	// heartbeat: refusal (non-empty: the heartbeat was refused, why);
	// assigned maps real topic ids to the view topic ids a
	// ConsumerGroupHeartbeat's assignment goes back under.
	refusal  string
	assigned map[[16]byte][16]byte
	// share: poisoned topic ids (sent so that the broker does not know
	// them) to the client's ids.
	poisoned map[[16]byte][16]byte
	// partsOf are a refused topic's partitions (DeleteRecords,
	// AddPartitionsToTxn before v4); txRefused AddPartitionsToTxn v4+'s.
	partsOf   map[string][]int32
	txRefused []txRefusal
}

type txRefusal struct {
	tx, topic string
	parts     []int32
}

func viewAdminKey(key int16) bool {
	switch kmsg.Key(key) {
	case kmsg.DescribeTopicPartitions, kmsg.DescribeConfigs, kmsg.AlterConfigs, kmsg.IncrementalAlterConfigs, kmsg.DeleteTopics, kmsg.CreateTopics,
		kmsg.CreatePartitions, kmsg.DeleteRecords, kmsg.ElectLeaders, kmsg.AlterPartitionAssignments, kmsg.AlterReplicaLogDirs, kmsg.OffsetDelete, kmsg.DescribeProducers, kmsg.AddPartitionsToTxn,
		kmsg.ConsumerGroupHeartbeat, kmsg.ShareGroupHeartbeat, kmsg.ShareFetch, kmsg.ShareAcknowledge:
		return true
	}
	return false
}

// virtualView returns the real topic of name when it is a virtual topic
// of a view that applies to the client.
func (vr *viewReq) virtualView(name string) (string, bool) {
	if v := vr.views.Lookup(name, vr.client); v != nil && v.Topic() != name {
		return v.Topic(), true
	}
	return "", false
}

func refusalMessage(name string) string {
	return fmt.Sprintf("rtproxy: %q is a view (a read-only virtual topic); this request is not served for it", name)
}

// refuse notes that name was taken out of the request.
func (pr *pair) refuse(vr *viewReq, name string) {
	vr.admin.refused = append(vr.admin.refused, name)
	pr.p.vm.refused.WithLabelValues(vr.admin.api).Inc()
	pr.p.log.Warn("refused a request naming a view", "api", vr.admin.api, "topic", name, "client", pr.clientAddr,
		"client_id", vr.client.ClientID)
}

// viewAdminRequest rewrites one of these requests; it reports whether
// the response needs viewAdminResponse.
func (pr *pair) viewAdminRequest(vr *viewReq, st *viewConn, req kmsg.Request) bool {
	vr.admin = &viewAdmin{api: kmsg.NameForKey(req.Key())}
	a := vr.admin
	switch r := req.(type) {
	case *kmsg.DescribeConfigsRequest:
		kept := r.Resources[:0]
		seen := map[string]bool{}
		for _, res := range r.Resources {
			if res.ResourceType != kmsg.ConfigResourceTypeTopic {
				kept = append(kept, res)
				continue
			}
			real, virtual := vr.virtualView(res.ResourceName)
			if !virtual {
				real = res.ResourceName
			}
			if a.described == nil {
				a.described = map[string][]string{}
			}
			a.described[real] = append(a.described[real], res.ResourceName)
			if seen[real] {
				continue // a second name of the real topic
			}
			seen[real] = true
			res.ResourceName = real
			kept = append(kept, res)
		}
		r.Resources = kept
		for real, names := range a.described {
			if len(names) == 1 && names[0] == real {
				delete(a.described, real)
			}
		}
		return len(a.described) > 0
	case *kmsg.DescribeTopicPartitionsRequest:
		kept := r.Topics[:0]
		seen := map[string]bool{}
		for _, t := range r.Topics {
			real, virtual := vr.virtualView(t.Topic)
			if !virtual {
				real = t.Topic
			}
			if a.described == nil {
				a.described = map[string][]string{}
			}
			a.described[real] = append(a.described[real], t.Topic)
			if seen[real] {
				continue
			}
			seen[real] = true
			t.Topic = real
			kept = append(kept, t)
		}
		r.Topics = kept
		if r.Cursor != nil {
			if real, virtual := vr.virtualView(r.Cursor.Topic); virtual {
				r.Cursor.Topic = real
			}
		}
		for real, names := range a.described {
			if len(names) == 1 && names[0] == real {
				delete(a.described, real)
			}
		}
		return len(a.described) > 0
	case *kmsg.AlterConfigsRequest:
		kept := r.Resources[:0]
		for _, res := range r.Resources {
			if _, virtual := vr.virtualView(res.ResourceName); virtual && res.ResourceType == kmsg.ConfigResourceTypeTopic {
				pr.refuse(vr, res.ResourceName)
				continue
			}
			kept = append(kept, res)
		}
		r.Resources = kept
	case *kmsg.IncrementalAlterConfigsRequest:
		kept := r.Resources[:0]
		for _, res := range r.Resources {
			if _, virtual := vr.virtualView(res.ResourceName); virtual && res.ResourceType == kmsg.ConfigResourceTypeTopic {
				pr.refuse(vr, res.ResourceName)
				continue
			}
			kept = append(kept, res)
		}
		r.Resources = kept
	case *kmsg.DeleteTopicsRequest:
		keptNames := r.TopicNames[:0]
		for _, n := range r.TopicNames {
			if _, virtual := vr.virtualView(n); virtual {
				pr.refuse(vr, n)
				continue
			}
			keptNames = append(keptNames, n)
		}
		r.TopicNames = keptNames
		kept := r.Topics[:0]
		for _, t := range r.Topics {
			name := ""
			if t.Topic != nil {
				name = *t.Topic
			} else if n, ok := st.byID[t.TopicID]; ok {
				name = n
			}
			if _, virtual := vr.virtualView(name); virtual {
				pr.refuse(vr, name)
				if t.Topic == nil {
					if a.refusedIDs == nil {
						a.refusedIDs = map[string][16]byte{}
					}
					a.refusedIDs[name] = t.TopicID
				}
				continue
			}
			kept = append(kept, t)
		}
		r.Topics = kept
	case *kmsg.CreateTopicsRequest:
		kept := r.Topics[:0]
		for _, t := range r.Topics {
			if _, virtual := vr.virtualView(t.Topic); virtual {
				pr.refuse(vr, t.Topic)
				continue
			}
			kept = append(kept, t)
		}
		r.Topics = kept
	case *kmsg.CreatePartitionsRequest:
		kept := r.Topics[:0]
		for _, t := range r.Topics {
			if _, virtual := vr.virtualView(t.Topic); virtual {
				pr.refuse(vr, t.Topic)
				continue
			}
			kept = append(kept, t)
		}
		r.Topics = kept
	case *kmsg.DeleteRecordsRequest:
		kept := r.Topics[:0]
		for _, t := range r.Topics {
			if _, virtual := vr.virtualView(t.Topic); virtual {
				pr.refuse(vr, t.Topic)
				for _, p := range t.Partitions {
					a.addPart(t.Topic, p.Partition)
				}
				continue
			}
			kept = append(kept, t)
		}
		r.Topics = kept
	case *kmsg.ElectLeadersRequest:
		kept := r.Topics[:0]
		for _, t := range r.Topics {
			if _, virtual := vr.virtualView(t.Topic); virtual {
				pr.refuse(vr, t.Topic)
				for _, p := range t.Partitions {
					a.addPart(t.Topic, p)
				}
				continue
			}
			kept = append(kept, t)
		}
		if r.Topics != nil {
			r.Topics = kept
		}
	case *kmsg.AlterPartitionAssignmentsRequest:
		kept := r.Topics[:0]
		for _, t := range r.Topics {
			if _, virtual := vr.virtualView(t.Topic); virtual {
				pr.refuse(vr, t.Topic)
				for _, p := range t.Partitions {
					a.addPart(t.Topic, p.Partition)
				}
				continue
			}
			kept = append(kept, t)
		}
		r.Topics = kept
	case *kmsg.AlterReplicaLogDirsRequest:
		for i := range r.Dirs {
			d := &r.Dirs[i]
			kept := d.Topics[:0]
			for _, t := range d.Topics {
				if _, virtual := vr.virtualView(t.Topic); virtual {
					if _, seen := a.partsOf[t.Topic]; !seen {
						pr.refuse(vr, t.Topic)
					}
					for _, p := range t.Partitions {
						a.addPart(t.Topic, p)
					}
					continue
				}
				kept = append(kept, t)
			}
			d.Topics = kept
		}
	case *kmsg.AddPartitionsToTxnRequest:
		kept := r.Topics[:0]
		for _, t := range r.Topics {
			if _, virtual := vr.virtualView(t.Topic); virtual {
				pr.refuse(vr, t.Topic)
				for _, p := range t.Partitions {
					a.addPart(t.Topic, p)
				}
				continue
			}
			kept = append(kept, t)
		}
		r.Topics = kept
		for i := range r.Transactions {
			tx := &r.Transactions[i]
			keptTx := tx.Topics[:0]
			for _, t := range tx.Topics {
				if _, virtual := vr.virtualView(t.Topic); virtual {
					pr.p.vm.refused.WithLabelValues(a.api).Inc()
					pr.p.log.Warn("refused a request naming a view", "api", a.api, "topic", t.Topic, "client", pr.clientAddr,
						"client_id", vr.client.ClientID)
					a.txRefused = append(a.txRefused, txRefusal{tx: tx.TransactionalID, topic: t.Topic, parts: t.Partitions})
					continue
				}
				keptTx = append(keptTx, t)
			}
			tx.Topics = keptTx
		}
	case *kmsg.OffsetDeleteRequest:
		var named bool
		r.Topics, named = mergeNames(vr, "", r.Topics, func(t *kmsg.OffsetDeleteRequestTopic) *string { return &t.Topic },
			func(t *kmsg.OffsetDeleteRequestTopic) *[]kmsg.OffsetDeleteRequestTopicPartition { return &t.Partitions },
			func(p *kmsg.OffsetDeleteRequestTopicPartition) int32 { return p.Partition },
			func(a, b *kmsg.OffsetDeleteRequestTopicPartition) bool { return true })
		return named
	case *kmsg.DescribeProducersRequest:
		var named bool
		r.Topics, named = mergeNames(vr, "", r.Topics, func(t *kmsg.DescribeProducersRequestTopic) *string { return &t.Topic },
			func(t *kmsg.DescribeProducersRequestTopic) *[]int32 { return &t.Partitions },
			func(p *int32) int32 { return *p }, func(a, b *int32) bool { return true })
		return named
	case *kmsg.ConsumerGroupHeartbeatRequest:
		return pr.viewConsumerHeartbeat(vr, st, r)
	case *kmsg.ShareGroupHeartbeatRequest:
		for _, n := range r.SubscribedTopicNames {
			if vr.views.Lookup(n, vr.client) != nil {
				a.refusal = fmt.Sprintf("rtproxy: %q is a view; a share group cannot read a view (consume it in a consumer group)", n)
				pr.refuse(vr, n)
				r.GroupID = "" // refused by the broker, no group touched
				return true
			}
		}
		return false
	case *kmsg.ShareFetchRequest:
		for i := range r.Topics {
			pr.poisonShare(vr, st, &r.Topics[i].TopicID)
		}
		return len(a.poisoned) > 0
	case *kmsg.ShareAcknowledgeRequest:
		for i := range r.Topics {
			pr.poisonShare(vr, st, &r.Topics[i].TopicID)
		}
		return len(a.poisoned) > 0
	}
	return len(a.refused) > 0 || len(a.txRefused) > 0
}

// poisonShare replaces the id of a share fetch's topic that is a view
// for the client with one no broker knows.
func (pr *pair) poisonShare(vr *viewReq, st *viewConn, id *[16]byte) {
	name, ok := pr.resolveName(st, "", *id, true)
	if !ok || vr.views.Lookup(name, vr.client) == nil {
		return
	}
	a := vr.admin
	if a.poisoned == nil {
		a.poisoned = map[[16]byte][16]byte{}
	}
	poison := viewTopicID("rtproxy share refused\x00" + name)
	a.poisoned[poison] = *id
	*id = poison
	pr.refuse(vr, name)
}

// viewConsumerHeartbeat renames a KIP-848 heartbeat's subscriptions to
// the real topics and its owned partitions to the real ids; the answer's
// assignment goes back under the views' ids. The names a connection
// subscribed to are kept (a heartbeat names them only when they change).
func (pr *pair) viewConsumerHeartbeat(vr *viewReq, st *viewConn, r *kmsg.ConsumerGroupHeartbeatRequest) bool {
	a := vr.admin
	if r.SubscribedTopicNames != nil {
		byReal, seen := map[string]string{}, map[string]string{}
		subs := make([]string, 0, len(r.SubscribedTopicNames))
		for _, n := range r.SubscribedTopicNames {
			real, virtual := vr.virtualView(n)
			if !virtual {
				real = n
			}
			prev, dup := seen[real]
			seen[real] = n
			if dup && prev != n {
				a.refusal = fmt.Sprintf("rtproxy: %q and %q read one topic (%q); one member cannot subscribe to both (a broker assigns a partition once)", prev, n, real)
				pr.refuse(vr, n)
				r.Group = ""
				return true
			}
			if !virtual {
				subs = append(subs, n)
				continue
			}
			byReal[real] = n
			subs = append(subs, real)
		}
		r.SubscribedTopicNames = subs
		if st.cgSubs == nil {
			st.cgSubs = map[string]map[string]string{}
		}
		st.cgSubs[r.Group] = byReal
	}
	byReal := st.cgSubs[r.Group]
	if len(byReal) == 0 {
		return false
	}
	a.assigned = map[[16]byte][16]byte{}
	for real, name := range byReal {
		rid, ok := pr.p.topicID(real)
		if !ok {
			a.refusal = fmt.Sprintf("rtproxy: the id of %q (which view %q reads) is not known yet; ask for the view's metadata first", real, name)
			pr.refuse(vr, name)
			r.Group = ""
			return true
		}
		a.assigned[rid] = viewTopicID(name)
	}
	for i := range r.Topics {
		t := &r.Topics[i]
		if n, ok := st.byID[t.TopicID]; ok {
			if real, virtual := vr.virtualView(n); virtual {
				if rid, ok := pr.p.topicID(real); ok {
					t.TopicID = rid
				}
			}
		}
	}
	return true
}

// addPart notes a refused topic's partition.
func (a *viewAdmin) addPart(name string, p int32) {
	if a.partsOf == nil {
		a.partsOf = map[string][]int32{}
	}
	a.partsOf[name] = append(a.partsOf[name], p)
}

// viewAdminResponse completes the answer to one of these requests.
func (pr *pair) viewAdminResponse(vr *viewReq, resp kmsg.Response) {
	a := vr.admin
	code := kerr.InvalidTopicException.Code
	switch r := resp.(type) {
	case *kmsg.DescribeConfigsResponse:
		out := make([]kmsg.DescribeConfigsResponseResource, 0, len(r.Resources))
		for _, res := range r.Resources {
			names, ok := a.described[res.ResourceName]
			if !ok || res.ResourceType != kmsg.ConfigResourceTypeTopic {
				out = append(out, res)
				continue
			}
			for _, n := range names {
				c := res
				c.ResourceName = n
				out = append(out, c)
			}
		}
		r.Resources = out
	case *kmsg.DescribeTopicPartitionsResponse:
		out := make([]kmsg.DescribeTopicPartitionsResponseTopic, 0, len(r.Topics))
		for _, t := range r.Topics {
			var names []string
			if t.Topic != nil {
				names = a.described[*t.Topic]
			}
			if len(names) == 0 {
				out = append(out, t)
				continue
			}
			real := *t.Topic
			for _, n := range names {
				c := t
				c.Topic = kmsg.StringPtr(n)
				if n != real {
					c.TopicID, c.IsInternal = viewTopicID(n), false
				}
				out = append(out, c)
			}
		}
		r.Topics = out
	case *kmsg.AlterConfigsResponse:
		for _, n := range a.refused {
			res := kmsg.NewAlterConfigsResponseResource()
			res.ResourceType, res.ResourceName, res.ErrorCode, res.ErrorMessage = kmsg.ConfigResourceTypeTopic, n, code, kmsg.StringPtr(refusalMessage(n))
			r.Resources = append(r.Resources, res)
		}
	case *kmsg.IncrementalAlterConfigsResponse:
		for _, n := range a.refused {
			res := kmsg.NewIncrementalAlterConfigsResponseResource()
			res.ResourceType, res.ResourceName, res.ErrorCode, res.ErrorMessage = kmsg.ConfigResourceTypeTopic, n, code, kmsg.StringPtr(refusalMessage(n))
			r.Resources = append(r.Resources, res)
		}
	case *kmsg.DeleteTopicsResponse:
		for _, n := range a.refused {
			t := kmsg.NewDeleteTopicsResponseTopic()
			t.Topic, t.ErrorCode, t.ErrorMessage = kmsg.StringPtr(n), code, kmsg.StringPtr(refusalMessage(n))
			if id, ok := a.refusedIDs[n]; ok {
				t.TopicID = id
			} else if r.Version >= 6 {
				t.TopicID = viewTopicID(n)
			}
			r.Topics = append(r.Topics, t)
		}
	case *kmsg.CreateTopicsResponse:
		for _, n := range a.refused {
			t := kmsg.NewCreateTopicsResponseTopic()
			t.Topic, t.ErrorCode = n, kerr.TopicAlreadyExists.Code
			t.ErrorMessage = kmsg.StringPtr(fmt.Sprintf("rtproxy: %q is a view (a read-only virtual topic)", n))
			t.TopicID = viewTopicID(n)
			r.Topics = append(r.Topics, t)
		}
	case *kmsg.CreatePartitionsResponse:
		for _, n := range a.refused {
			t := kmsg.NewCreatePartitionsResponseTopic()
			t.Topic, t.ErrorCode, t.ErrorMessage = n, code, kmsg.StringPtr(refusalMessage(n))
			r.Topics = append(r.Topics, t)
		}
	case *kmsg.DeleteRecordsResponse:
		for _, n := range a.refused {
			t := kmsg.NewDeleteRecordsResponseTopic()
			t.Topic = n
			for _, p := range a.partsOf[n] {
				rp := kmsg.NewDeleteRecordsResponseTopicPartition()
				rp.Partition, rp.LowWatermark, rp.ErrorCode = p, -1, code
				t.Partitions = append(t.Partitions, rp)
			}
			r.Topics = append(r.Topics, t)
		}
	case *kmsg.ElectLeadersResponse:
		for _, n := range a.refused {
			t := kmsg.NewElectLeadersResponseTopic()
			t.Topic = n
			for _, p := range a.partsOf[n] {
				rp := kmsg.NewElectLeadersResponseTopicPartition()
				rp.Partition, rp.ErrorCode, rp.ErrorMessage = p, code, kmsg.StringPtr(refusalMessage(n))
				t.Partitions = append(t.Partitions, rp)
			}
			r.Topics = append(r.Topics, t)
		}
	case *kmsg.AlterPartitionAssignmentsResponse:
		for _, n := range a.refused {
			t := kmsg.NewAlterPartitionAssignmentsResponseTopic()
			t.Topic = n
			for _, p := range a.partsOf[n] {
				rp := kmsg.NewAlterPartitionAssignmentsResponseTopicPartition()
				rp.Partition, rp.ErrorCode, rp.ErrorMessage = p, code, kmsg.StringPtr(refusalMessage(n))
				t.Partitions = append(t.Partitions, rp)
			}
			r.Topics = append(r.Topics, t)
		}
	case *kmsg.AlterReplicaLogDirsResponse:
		for _, n := range a.refused {
			t := kmsg.NewAlterReplicaLogDirsResponseTopic()
			t.Topic = n
			for _, p := range a.partsOf[n] {
				rp := kmsg.NewAlterReplicaLogDirsResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p, code
				t.Partitions = append(t.Partitions, rp)
			}
			r.Topics = append(r.Topics, t)
		}
	case *kmsg.AddPartitionsToTxnResponse:
		for _, n := range a.refused {
			t := kmsg.NewAddPartitionsToTxnResponseTopic()
			t.Topic = n
			for _, p := range a.partsOf[n] {
				rp := kmsg.NewAddPartitionsToTxnResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p, code
				t.Partitions = append(t.Partitions, rp)
			}
			r.Topics = append(r.Topics, t)
		}
	next:
		for _, tr := range a.txRefused {
			t := kmsg.NewAddPartitionsToTxnResponseTransactionTopic()
			t.Topic = tr.topic
			for _, p := range tr.parts {
				rp := kmsg.NewAddPartitionsToTxnResponseTransactionTopicPartition()
				rp.Partition, rp.ErrorCode = p, code
				t.Partitions = append(t.Partitions, rp)
			}
			for j := range r.Transactions {
				if r.Transactions[j].TransactionalID == tr.tx {
					r.Transactions[j].Topics = append(r.Transactions[j].Topics, t)
					continue next
				}
			}
			rt := kmsg.NewAddPartitionsToTxnResponseTransaction()
			rt.TransactionalID, rt.Topics = tr.tx, []kmsg.AddPartitionsToTxnResponseTransactionTopic{t}
			r.Transactions = append(r.Transactions, rt)
		}
	case *kmsg.OffsetDeleteResponse:
		r.Topics = fanNames(vr, "", r.Topics, func(t *kmsg.OffsetDeleteResponseTopic) *string { return &t.Topic },
			func(t *kmsg.OffsetDeleteResponseTopic) *[]kmsg.OffsetDeleteResponseTopicPartition {
				return &t.Partitions
			},
			func(p *kmsg.OffsetDeleteResponseTopicPartition) int32 { return p.Partition }, nil)
	case *kmsg.DescribeProducersResponse:
		r.Topics = fanNames(vr, "", r.Topics, func(t *kmsg.DescribeProducersResponseTopic) *string { return &t.Topic },
			func(t *kmsg.DescribeProducersResponseTopic) *[]kmsg.DescribeProducersResponseTopicPartition {
				return &t.Partitions
			},
			func(p *kmsg.DescribeProducersResponseTopicPartition) int32 { return p.Partition }, nil)
	case *kmsg.ConsumerGroupHeartbeatResponse:
		if a.refusal != "" {
			r.ErrorCode, r.ErrorMessage = kerr.InvalidRequest.Code, kmsg.StringPtr(a.refusal)
			return
		}
		if r.Assignment != nil {
			for i := range r.Assignment.Topics {
				t := &r.Assignment.Topics[i]
				if vid, ok := a.assigned[t.TopicID]; ok {
					t.TopicID = vid
				}
			}
		}
	case *kmsg.ShareGroupHeartbeatResponse:
		if a.refusal != "" {
			r.ErrorCode, r.ErrorMessage = kerr.InvalidTopicException.Code, kmsg.StringPtr(a.refusal)
		}
	case *kmsg.ShareFetchResponse:
		for i := range r.Topics {
			t := &r.Topics[i]
			id, ok := a.poisoned[t.TopicID]
			if !ok {
				continue
			}
			t.TopicID = id
			for j := range t.Partitions {
				p := &t.Partitions[j]
				p.ErrorCode, p.ErrorMessage = code, kmsg.StringPtr("rtproxy: a share group cannot read a view")
				p.Records, p.AcquiredRecords = nil, nil
			}
		}
	case *kmsg.ShareAcknowledgeResponse:
		for i := range r.Topics {
			t := &r.Topics[i]
			id, ok := a.poisoned[t.TopicID]
			if !ok {
				continue
			}
			t.TopicID = id
			for j := range t.Partitions {
				p := &t.Partitions[j]
				p.ErrorCode, p.ErrorMessage = code, kmsg.StringPtr("rtproxy: a share group cannot read a view")
			}
		}
	}
}
