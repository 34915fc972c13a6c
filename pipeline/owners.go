package pipeline

// Who owns which partition of a route: the status page shows every
// partition of the route's topics with its owner in the group, not only
// this instance's. The coordinator is asked when this instance's
// assignment moves, and when the status is read with owners older than
// ownersMaxAge (ownersRestAge once the group has settled), never on a
// timer of the route's: an idle route used to ask every 5 s, with a
// Metadata request each time.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ownersMaxAge is how old the owners /routes shows may be before reading
// the status asks for them again, for ownersSettle after this instance's
// assignment moved (the group settles: other members take or release
// partitions after this one's move). Then the group is at rest, and the
// status (the status page samples it every few seconds) asks at most once
// per ownersRestAge.
const (
	ownersMaxAge  = 5 * time.Second
	ownersSettle  = 20 * time.Second
	ownersRestAge = time.Minute
)

// assignmentMoved is called by the group's callbacks: the owners and the
// tasks' lags are to be looked at again.
func (r *route) assignmentMoved() {
	r.grp.mu.Lock()
	r.grp.mu.movedAt = time.Now()
	r.grp.mu.Unlock()
	r.askOwners()
	r.noteLag()
}

// askOwners has the lag loop describe the group's owners (at most one ask
// waits). It never blocks.
func (r *route) askOwners() {
	r.grp.mu.Lock()
	r.grp.mu.ownersAt = time.Now()
	r.grp.mu.Unlock()
	select {
	case r.ownersWake <- struct{}{}:
	default:
	}
}

// ownersStaleLocked reports whether the owners are old enough for a status
// read to ask again; grp.mu is held.
func (r *route) ownersStaleLocked() bool {
	age := time.Since(r.grp.mu.ownersAt)
	if time.Since(r.grp.mu.movedAt) < ownersSettle {
		return age > ownersMaxAge
	}
	return age > ownersRestAge
}

// describeOwners asks the group's coordinator for its members and their
// assignments and keeps them for status.
func (r *route) describeOwners() {
	adm, cl := r.grp.adm, r.cl
	if adm == nil || cl == nil {
		return
	}
	self, _ := cl.GroupMetadata()
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
	defer cancel()
	group := r.def.GroupID()
	var owners []PartitionOwner
	var err error
	add := func(topic string, parts []int32, host, member string) {
		for _, p := range parts {
			owners = append(owners, PartitionOwner{Topic: topic, Partition: p,
				Owner: ownerName(host, member), Self: member == self})
		}
	}
	if r.grp.proto() == "consumer" {
		err = r.describeConsumerGroup(ctx, group, add)
	} else {
		var ds kadm.DescribedGroups
		if ds, err = adm.DescribeGroups(ctx, group); err == nil {
			err = ds.Error()
		}
		if err == nil {
			for _, m := range ds[group].Members {
				if c, ok := m.Assigned.AsConsumer(); ok {
					for _, t := range c.Topics {
						add(t.Topic, t.Partitions, m.ClientHost, m.MemberID)
					}
				}
			}
		}
	}
	slices.SortFunc(owners, func(a, b PartitionOwner) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	r.grp.mu.Lock()
	defer r.grp.mu.Unlock()
	if err != nil {
		if r.ctx.Err() == nil {
			r.grp.mu.ownersErr = fmt.Sprintf("describe group %s: %v", group, err)
		}
		return
	}
	r.grp.mu.owners, r.grp.mu.ownersErr = owners, ""
}

// describeConsumerGroup describes a KIP-848 group with a raw
// ConsumerGroupDescribe: a coordinator may name assigned topics by id only
// (kadm's describe keeps the names), so ids are resolved from metadata.
func (r *route) describeConsumerGroup(ctx context.Context, group string, add func(string, []int32, string, string)) error {
	topics := make([]string, 0, len(r.plan.segs))
	for _, sg := range r.plan.segs {
		topics = append(topics, sg.topic)
	}
	md, err := r.grp.adm.Metadata(ctx, topics...)
	if err != nil {
		return err
	}
	names := map[[16]byte]string{}
	for _, td := range md.Topics {
		names[td.ID] = td.Topic
	}
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	for _, sh := range r.logCl.RequestSharded(ctx, req) {
		if sh.Err != nil {
			return sh.Err
		}
		resp, ok := sh.Resp.(*kmsg.ConsumerGroupDescribeResponse)
		if !ok {
			return fmt.Errorf("unexpected response %T", sh.Resp)
		}
		for _, g := range resp.Groups {
			if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
				return err
			}
			for _, m := range g.Members {
				for _, tp := range m.Assignment.TopicPartitions {
					name := tp.Topic
					if name == "" {
						name = names[tp.TopicID]
					}
					if name != "" {
						add(name, tp.Partitions, m.ClientHost, m.MemberID)
					}
				}
			}
		}
	}
	return nil
}

// ownerName is how a member is shown: its host (as the coordinator saw
// it) and the start of its member id.
func ownerName(host, member string) string {
	host = strings.TrimPrefix(host, "/")
	if len(member) > 12 {
		member = member[:12] + "…"
	}
	return host + " " + member
}
