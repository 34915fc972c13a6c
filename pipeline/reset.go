package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A route's state lives in Kafka as much as in the state directory: its
// consumer group holds the committed offsets, and its changelog and
// repartition topics hold the keyed state and the records between
// segments. Dropping a route's state (state_retention, `rtproxy state
// drop`) must reset those too, or a restored rule file would resume from
// the group's offsets instead of source.start. The names are recorded in
// the state directory when the route starts (a rule file deleted later no
// longer says what its source.group was), under the durable step
// kafkaStateStep.

// kafkaStateStep is the durable record naming the route's group and
// internal topics.
const kafkaStateStep = "kafka"

// KafkaState names what a route keeps in Kafka.
type KafkaState struct {
	Group  string   `json:"group"`
	Topics []string `json:"topics"` // changelog and repartition topics
	// Source is the source topic the route last ran on: the local
	// checkpoint's source offsets belong to it.
	Source string `json:"source,omitempty"`
	// Created are the sink and dead-letter topics a version of the route
	// created: the route recreates them when they are deleted, whichever
	// version runs then (recreate.go). A reset never deletes them.
	Created []string `json:"created,omitempty"`
}

// recordKafkaState stores the route's group, internal topics and source
// topic, adding to the topics of earlier versions (an edit that removes a
// keyed step leaves its topics behind, and a drop still deletes them). It
// returns the source topic recorded before ("" when none was).
func (r *route) recordKafkaState() (prevSource string, err error) {
	ks := KafkaState{Group: r.def.GroupID(), Source: r.def.Source.Topic}
	if old, ok, err := r.m.store().GetDurable(r.name, kafkaStateStep); err != nil {
		return "", fmt.Errorf("route %q: %w", r.name, err)
	} else if ok {
		var prev KafkaState
		if json.Unmarshal(old, &prev) == nil {
			prevSource = prev.Source
			if prev.Group == ks.Group {
				ks.Topics = prev.Topics
			}
			ks.Created = prev.Created
		}
	}
	r.recreate.Lock()
	for t := range r.recreate.created {
		if !slices.Contains(ks.Created, t) {
			ks.Created = append(ks.Created, t)
		}
	}
	if r.recreate.created == nil {
		r.recreate.created = map[string]bool{}
	}
	for _, t := range ks.Created {
		r.recreate.created[t] = true
	}
	r.recreate.Unlock()
	slices.Sort(ks.Created)
	for _, seg := range r.keyedSegs() {
		for _, t := range []string{seg.topic, seg.changelog} {
			if !slices.Contains(ks.Topics, t) {
				ks.Topics = append(ks.Topics, t)
			}
		}
	}
	slices.Sort(ks.Topics)
	b, _ := json.Marshal(ks)
	if err := r.m.store().PutDurable(r.name, kafkaStateStep, b); err != nil {
		return "", fmt.Errorf("route %q: %w", r.name, err)
	}
	return prevSource, nil
}

// ErrGroupActive is returned by ResetKafkaState while another instance
// still runs the route: its group has members.
var ErrGroupActive = errors.New("the route's consumer group still has members (another instance runs the route)")

// ResetKafkaState deletes the route's consumer group (its committed
// offsets) and its changelog and repartition topics. A group or topic that
// is already gone is not an error. It fails with ErrGroupActive, and
// deletes nothing, while the group has members.
func ResetKafkaState(ctx context.Context, cl *kgo.Client, ks KafkaState) error {
	adm := kadm.NewClient(cl)
	if ks.Group != "" {
		resp, err := adm.DeleteGroup(ctx, ks.Group)
		if err == nil {
			err = resp.Err
		}
		switch {
		case err == nil, errors.Is(err, kerr.GroupIDNotFound):
		case errors.Is(err, kerr.NonEmptyGroup):
			return fmt.Errorf("group %s: %w", ks.Group, ErrGroupActive)
		default:
			return fmt.Errorf("delete group %s: %w", ks.Group, err)
		}
	}
	if len(ks.Topics) == 0 {
		return nil
	}
	resps, err := adm.DeleteTopics(ctx, ks.Topics...)
	if err != nil {
		return fmt.Errorf("delete topics %v: %w", ks.Topics, err)
	}
	for _, t := range resps.Sorted() {
		if t.Err != nil && !errors.Is(t.Err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("delete topic %s: %w", t.Topic, t.Err)
		}
	}
	return nil
}

// dropRouteState resets what the route keeps in Kafka, then drops its
// local state. When the Kafka part fails, the local state stays too, so
// that a retry finds the names again.
func (m *Manager) dropRouteState(ctx context.Context, route string) error {
	db := m.store()
	if db == nil {
		return nil // never opened: no state of any route is kept
	}
	ks, ok, err := ReadKafkaState(db.GetDurable, route)
	if err != nil {
		return err
	}
	if ok {
		cl, err := kgo.NewClient(clientBase(m.cfg)...)
		if err != nil {
			return err
		}
		err = ResetKafkaState(ctx, cl, ks)
		cl.Close()
		if err != nil {
			return err
		}
		m.log.Info("route's Kafka state reset", "route", route, "group", ks.Group, "topics", ks.Topics)
	}
	return db.DropRoute(route)
}

// ReadKafkaState returns what the route recorded about its Kafka state in
// a state directory (ok false when it recorded nothing: it never started
// with this version of rtproxy).
func ReadKafkaState(get func(route, step string) ([]byte, bool, error), route string) (KafkaState, bool, error) {
	raw, ok, err := get(route, kafkaStateStep)
	if err != nil || !ok {
		return KafkaState{}, false, err
	}
	var ks KafkaState
	if err := json.Unmarshal(raw, &ks); err != nil {
		return KafkaState{}, false, fmt.Errorf("route %q: the record of its Kafka state is unreadable: %w", route, err)
	}
	return ks, true, nil
}
