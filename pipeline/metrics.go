package pipeline

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the pipeline's collectors, registered once per Manager on the
// Registerer of its Config. Names are the project's agreed ones.
type metrics struct {
	recordsIn      *prometheus.CounterVec   // route, partition
	recordsOut     *prometheus.CounterVec   // route
	dropped        *prometheus.CounterVec   // route, step
	deadLetters    *prometheus.CounterVec   // route, reason
	panics         *prometheus.CounterVec   // route, where
	staleFetches   *prometheus.CounterVec   // route
	processing     *prometheus.HistogramVec // route
	endToEnd       *prometheus.HistogramVec // route
	lag            *prometheus.GaugeVec     // route, partition
	watermark      *prometheus.GaugeVec     // route
	sinkErrors     *prometheus.CounterVec   // route
	stateKeys      *prometheus.GaugeVec     // route, step
	stateBytes     *prometheus.GaugeVec     // route
	checkpointDur  *prometheus.HistogramVec // route
	checkpointLast *prometheus.GaugeVec     // route
	// checkpointSkipped counts checkpoint ticks that found nothing moved.
	checkpointSkipped *prometheus.CounterVec // route
	// busy is the time a route's tasks spent running fetched records
	// through their steps (routeCost has the rest of a route's cost).
	busy *prometheus.CounterVec // route

	partitionsOwned *prometheus.GaugeVec     // route
	rebalances      *prometheus.CounterVec   // route
	restoreRecords  *prometheus.CounterVec   // route
	restoreSeconds  *prometheus.HistogramVec // route
	repeatsSkipped  *prometheus.CounterVec   // route
	txnCommit       *prometheus.HistogramVec // route
	tapped          *prometheus.CounterVec   // route
	tapDropped      *prometheus.CounterVec   // route
	txnAborts       *prometheus.CounterVec   // route
	// sinkOut and sinkWriteErrors are per sink of a route (sinkset.go).
	sinkOut         *prometheus.CounterVec // route, sink
	sinkWriteErrors *prometheus.CounterVec // route, sink
	stateFailed     prometheus.Gauge
	retentionSweeps prometheus.Counter
	// http are the HTTP sinks' request metrics (sink_http.go), on the
	// same registry.
	http *httpMetrics
}

// latencyBuckets span 100µs to ~10s: the pipeline aims at single-digit
// milliseconds, and recovery replays land in the seconds.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2, 18)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		recordsIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_pipeline_records_in_total", Help: "Records read by a route, per partition of every topic it reads: the source's (partition=\"<p>\") and each stream join's second topic's (partition=\"<topic>:<p>\").",
		}, []string{"route", "partition"}),
		recordsOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_pipeline_records_out_total", Help: "Records written to a route's sink and acknowledged.",
		}, []string{"route"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_pipeline_records_dropped_total", Help: "Records a step let through to nothing (filter, duplicate).",
		}, []string{"route", "step"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_pipeline_dead_letters_total", Help: "Records sent to a route's dead-letter topic, by reason.",
		}, []string{"route", "reason"}),
		staleFetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_route_txn_stale_fetches_total", Help: "Exactly-once routes: fetches after an aborted transaction that returned records from before the reset (dropped; the transaction aborts again).",
		}, []string{"route"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_route_panics_total", Help: "Panics in a route's own code (a bug), by where: record (the record became a dead letter) or the loop that restarted the route.",
		}, []string{"route", "where"}),
		processing: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtproxy_pipeline_processing_latency_seconds", Help: "Record fetched to every output acknowledged.",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		endToEnd: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtproxy_pipeline_end_to_end_latency_seconds", Help: "Source record timestamp to sink acknowledgement.",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rtproxy_pipeline_lag_records", Help: "High watermark minus done offset, per source partition.",
		}, []string{"route", "partition"}),
		watermark: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rtproxy_pipeline_watermark_seconds", Help: "A route's event-time watermark, epoch seconds.",
		}, []string{"route"}),
		sinkOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_pipeline_sink_records_out_total", Help: "Outputs a sink of a route acknowledged, per sink (its topic, or http / http-<branch>).",
		}, []string{"route", "sink"}),
		sinkWriteErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_pipeline_sink_output_errors_total", Help: "Outputs that failed on a sink of a route, per sink: a write the sink failed (retried, or refused and dead-lettered) or a value its format could not encode.",
		}, []string{"route", "sink"}),
		sinkErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_pipeline_sink_errors_total", Help: "Failed writes to a route's sink or dead-letter topic (retried).",
		}, []string{"route"}),
		stateKeys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rtproxy_state_keys", Help: "Keys in a step's snapshot at the last checkpoint.",
		}, []string{"route", "step"}),
		stateBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rtproxy_state_bytes", Help: "Bytes of a route's step snapshots at the last checkpoint.",
		}, []string{"route"}),
		checkpointDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtproxy_checkpoint_duration_seconds", Help: "Time from a checkpoint's cut to its durable write.",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		checkpointLast: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rtproxy_checkpoint_last_timestamp_seconds", Help: "When a route last wrote a checkpoint, epoch seconds.",
		}, []string{"route"}),
		checkpointSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_checkpoint_skipped_total", Help: "Checkpoint ticks that wrote nothing: nothing had moved since the route's last checkpoint (its time still advances).",
		}, []string{"route"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_route_busy_seconds_total", Help: "Time a route's tasks spent running records through their steps (wall time of each batch, waits for a full producer buffer included).",
		}, []string{"route"}),
		partitionsOwned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rtproxy_route_partitions_owned", Help: "Partitions (source and repartition topics) this instance owns in a route's group.",
		}, []string{"route"}),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_route_rebalances_total", Help: "Assignments this instance received from a route's group.",
		}, []string{"route"}),
		restoreRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_state_restore_records_total", Help: "Changelog records read to rebuild keyed state.",
		}, []string{"route"}),
		restoreSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtproxy_state_restore_seconds", Help: "Time to rebuild one partition's keyed state from its changelog.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}, []string{"route"}),
		repeatsSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_pipeline_repartition_repeats_skipped_total", Help: "Repartitioned records written again by a replaying writer and skipped.",
		}, []string{"route"}),
		tapped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_route_tapped_records_total", Help: "Source records a route processed from the produce path (the proxy's tap) rather than from its fetch.",
		}, []string{"route"}),
		tapDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_route_tap_dropped_batches_total", Help: "Tapped batches a route dropped (its queue full, or too many waiting for the fetch); their records come by the fetch.",
		}, []string{"route"}),
		txnCommit: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rtproxy_route_txn_commit_seconds", Help: "Exactly-once routes: time from a checkpoint's cut to its transaction committed (dispatch is paused meanwhile).",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		txnAborts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rtproxy_route_txn_aborts_total", Help: "Exactly-once routes: transactions aborted; the route went back to its last committed checkpoint.",
		}, []string{"route"}),
		retentionSweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rtproxy_state_retention_sweeps_total", Help: "Passes of state_retention over the routes with state (every state_retention / 10, at least 100ms).",
		}),
		stateFailed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rtproxy_state_store_failed", Help: "1 once the state store (pebble) has failed: routes with state stop until the process restarts.",
		}),
	}
	for _, c := range []prometheus.Collector{m.stateFailed, m.retentionSweeps, m.partitionsOwned, m.rebalances, m.restoreRecords, m.restoreSeconds, m.repeatsSkipped, m.txnCommit, m.txnAborts, m.tapped, m.tapDropped, m.recordsIn, m.recordsOut, m.dropped, m.deadLetters, m.panics, m.staleFetches, m.processing,
		m.endToEnd, m.lag, m.watermark, m.sinkErrors, m.sinkOut, m.sinkWriteErrors, m.stateKeys, m.stateBytes, m.checkpointDur, m.checkpointLast, m.checkpointSkipped, m.busy} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("pipeline metrics: %w", err)
		}
	}
	h, err := httpMetricsOn(reg)
	if err != nil {
		return nil, fmt.Errorf("pipeline metrics: %w", err)
	}
	m.http = h
	return m, nil
}

// forgetRoute deletes every series of a route whose state retention
// dropped: a route that is gone for good leaves nothing on /metrics.
func (m *metrics) forgetRoute(route string) {
	only := prometheus.Labels{"route": route}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
		m.recordsIn, m.recordsOut, m.dropped, m.deadLetters, m.panics, m.staleFetches, m.processing, m.endToEnd, m.lag, m.watermark,
		m.sinkErrors, m.sinkOut, m.sinkWriteErrors, m.stateKeys, m.stateBytes, m.checkpointDur, m.checkpointLast, m.checkpointSkipped, m.busy, m.partitionsOwned,
		m.rebalances, m.restoreRecords, m.restoreSeconds, m.repeatsSkipped, m.txnCommit, m.txnAborts, m.tapped, m.tapDropped,
		m.http.requests, m.http.retries, m.http.latency,
	} {
		v.DeletePartialMatch(only)
	}
}

// forgetSinks deletes the series of the sinks of route named (their
// `sink` label): the per-sink records and errors, and an HTTP sink's
// requests, retries and latencies. Only series of those sinks go; the
// route's other sinks keep theirs, and their counts.
func (m *metrics) forgetSinks(route string, sinks []string) {
	for _, s := range sinks {
		only := prometheus.Labels{"route": route, "sink": s}
		for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
			m.sinkOut, m.sinkWriteErrors, m.http.requests, m.http.retries, m.http.latency,
		} {
			v.DeletePartialMatch(only)
		}
	}
}
