package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// A topic the route writes to can be deleted while it runs (by hand, by a
// cleanup job). Writes to it then fail as unknown and are retried, offsets
// holding. The route recreates what is its own: its repartition and
// changelog topics, and the sink and dead-letter topics that a version of
// it created (recorded in the state directory with its Kafka state, so a
// reload or restart keeps them its own). A sink or dead-letter topic that
// existed before is
// someone else's to recreate (with their partitions and configs); the route
// reports it (last_error, rtproxy_pipeline_sink_errors_total) and goes on
// retrying until it is back.

// recreateEvery bounds recreation attempts per topic.
const recreateEvery = 5 * time.Second

// ownsTopic reports whether the route may recreate topic.
func (r *route) ownsTopic(topic string) bool {
	for _, seg := range r.keyedSegs() {
		if topic == seg.topic || topic == seg.changelog {
			return true
		}
	}
	r.recreate.Lock()
	defer r.recreate.Unlock()
	return r.recreate.created[topic]
}

// missingTopic is called when a write to topic failed because the topic is
// unknown.
func (r *route) missingTopic(topic string, err error) {
	if !errors.Is(err, kerr.UnknownTopicOrPartition) && !errors.Is(err, kerr.UnknownTopicID) {
		return
	}
	r.recreate.Lock()
	if r.recreate.last == nil {
		r.recreate.last = map[string]time.Time{}
	}
	if time.Since(r.recreate.last[topic]) < recreateEvery {
		r.recreate.Unlock()
		return
	}
	r.recreate.last[topic] = time.Now()
	r.recreate.Unlock()
	owned := r.ownsTopic(topic)
	if !owned {
		r.log.Warn("a topic the route writes to does not exist, and rtproxy did not create it: retrying until it is back",
			"topic", topic)
	}
	go func() {
		if owned {
			ctx, cancel := context.WithTimeout(r.ctx, 15*time.Second)
			defer cancel()
			// ensureTopics creates whatever of the route's topics is
			// missing, with the source's partition count (changelogs
			// compacted).
			if _, err := ensureTopics(ctx, r.grp.adm, r.def); err != nil {
				r.log.Warn("recreating a deleted topic failed; will retry", "topic", topic, "err", err)
				return
			}
			r.log.Warn("a topic the route writes to was deleted; recreated it", "topic", topic)
		}
		// The client keeps the deleted topic's id and would go on
		// writing to it (UNKNOWN_TOPIC_ID): forgetting the topic makes
		// it look the topic up again. Writes it fails are retried.
		r.cl.PurgeTopicsFromProducing(topic)
	}()
}
