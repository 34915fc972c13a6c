package pipeline

import (
	"errors"
	"fmt"

	"github.com/rtproxy/rtproxy/rules"
)

// checkDefinition refuses a route that lacks a value the pipeline needs.
// Defaults are rules'; rules.Load fills every one in, and the pipeline
// never fills in one of its own, so a route built another way must carry
// them all. A refused route stays in state error with the reason.
func checkDefinition(d *rules.Route) error {
	var errs []error
	bad := func(f string, args ...any) { errs = append(errs, fmt.Errorf(f, args...)) }
	s := d.Source
	if s.Topic == "" {
		bad("source.topic is empty")
	}
	switch s.Format {
	case rules.FormatJSON, rules.FormatRaw, rules.FormatAvro, rules.FormatProtobuf:
	default:
		bad("source.format %q is none of json, raw, avro, protobuf", s.Format)
	}
	if s.Start != "earliest" && s.Start != "latest" {
		bad("source.start %q is neither earliest nor latest", s.Start)
	}
	if s.IdleTimeout <= 0 {
		bad("source.idle_timeout %v must be positive", s.IdleTimeout)
	}
	if s.Watermark < 0 {
		bad("source.watermark %v must not be negative", s.Watermark)
	}
	if d.Switch == nil && d.Sink.Target() == "" {
		bad("sink has no target (sink.topic is empty)")
	}
	for i, b := range d.Switch {
		if b.Sink.Target() == "" {
			bad("switch branch %d's sink has no target", i+1)
		}
		if b.When == nil && i != len(d.Switch)-1 {
			bad("switch branch %d has no condition and is not the last", i+1)
		}
	}
	if d.Sink.Delivery != rules.DeliveryAtLeastOnce && d.Sink.Delivery != rules.DeliveryExactlyOnce {
		bad("sink.delivery %q is neither %s nor %s", d.Sink.Delivery, rules.DeliveryAtLeastOnce, rules.DeliveryExactlyOnce)
	}
	if d.DeadLetter == "" {
		bad("dead_letter is empty")
	}
	if d.CheckpointInterval <= 0 {
		bad("checkpoint_interval %v must be positive", d.CheckpointInterval)
	}
	for i := range d.Steps {
		if d.Steps[i].Build == nil {
			bad("step %d (%s) cannot be built", d.Steps[i].Index, d.Steps[i].Kind)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("route %q: %w", d.Name, err)
	}
	return nil
}
