package pipeline

// Panics. A step that panics costs one dead letter (chain.process). The
// rest of a route's own code is not expected to panic either, but a bug
// there must not take the process, and every other route, down with it:
//
//   - while one record is processed (decoding, event time, the hand-off
//     between steps, a repartitioned record's envelope), the record becomes
//     a dead letter with reason error at step "internal", inside the
//     record's ticket, so its offset is done only once the dead letter is
//     written (recordPanicked);
//   - in one of the route's loops (polling, dispatch, checkpoints, idle
//     ticks, lag, a topic table's reader), the route restarts from its last checkpoint, as
//     after a fenced producer: nothing is lost, outputs since the
//     checkpoint may be written again (survive).
//
// Either way the panic is logged at error with its stack and counted in
// rtproxy_route_panics_total{route, where}.

import (
	"fmt"
	"runtime/debug"

	"github.com/rtproxy/rtproxy/operators"
)

// panicTestHook, when set by a test, runs where a source record is
// processed, at the start of each loop survive wraps (but dispatch and
// table), and where a checkpoint takes its cut with its locks held ("cut"),
// with the route and the place ("record" or the loop's name); it may
// panic.
var panicTestHook func(route, where string)

// stepInternal labels the dead letters of records whose processing
// panicked outside any step.
const stepInternal = "internal"

// recordPanicked is called with what recover gave while one record was
// processed, before the record's ticket is released: the record becomes a
// dead letter that joins the ticket.
func (r *route) recordPanicked(v any, rec *operators.Record, tk *ticket) {
	r.m.met.panics.WithLabelValues(r.name, "record").Inc()
	r.log.Error("processing a record panicked; it goes to the dead-letter topic", "topic", rec.Topic,
		"partition", rec.Partition, "offset", rec.Offset, "panic", r.shownText(fmt.Sprint(v), rec), "stack", string(debug.Stack()))
	r.deadLetter(rec, operators.ReasonError, fmt.Errorf("internal error: %v", v), stepInternal, tk)
}

// survive runs one of the route's loops; a panic in it restarts the route
// from its last checkpoint.
func (r *route) survive(loop string, run func()) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		r.m.met.panics.WithLabelValues(r.name, loop).Inc()
		r.log.Error("a route loop panicked; restarting the route from its last checkpoint", "loop", loop,
			"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		r.setState("error", fmt.Sprintf("internal error in the %s loop: %v; restarting from the last checkpoint", loop, v))
		go r.m.restartRoute(r)
	}()
	// Not before a dispatch loop or a table reader: they close their
	// done channel themselves, and the route's stop waits for it.
	if h := panicTestHook; h != nil && loop != "dispatch" && loop != "table" {
		h(r.name, loop)
	}
	run()
}
