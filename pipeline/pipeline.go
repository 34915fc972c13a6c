// Package pipeline runs rtproxy's routes. Every instance that runs a route
// joins its consumer group; the route is cut into segments at each keyed
// step, and each (topic, partition) the group gives the instance is one
// task: a goroutine that runs its segment's steps on each record the moment
// it is fetched. Records reach a keyed step through its repartition topic,
// keyed by the step's key, so a key has one owner in the whole deployment
// (there is no in-process shuffle and no worker pool). The pipeline tracks
// event-time watermarks across repartitions, writes outputs and dead
// letters through an idempotent (or transactional) producer, and
// checkpoints state and offsets together as a consistent cut.
//
// Its imports are the row of "Packages and their arrows" in
// docs/ARCHITECTURE.md (test/layering checks them): never protocol/,
// config/ or cmd/.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/internal/serde"
	"github.com/rtproxy/rtproxy/rules"
	"github.com/rtproxy/rtproxy/state"
)

// Config configures a Manager.
type Config struct {
	// Seeds are the upstream brokers the pipeline connects to directly.
	Seeds []string
	// ClientOpts are added to every franz-go client (TLS, SASL, dialer).
	ClientOpts []kgo.Opt
	// StateDir holds the pebble state of every route.
	StateDir string
	// StateOptions tune the state store (tests inject disk errors
	// through its FS).
	StateOptions state.Options
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the pipeline metrics; nil uses a private registry.
	Registerer prometheus.Registerer
	// SessionTimeout is how long the group waits for a silent instance
	// before giving its partitions to others (Kafka's session.timeout.ms;
	// group_session_timeout). Required: the default is config's.
	SessionTimeout time.Duration
	// GroupProtocol is "auto" (KIP-848 when every broker speaks
	// ConsumerGroupHeartbeat v1, else classic), "consumer" or "classic"
	// (cooperative-sticky); group_protocol. Required: the default is
	// config's.
	GroupProtocol string
	// MetadataMaxAge bounds how long partitions added to a source go
	// unnoticed (Kafka's metadata.max.age.ms). Default 10s.
	MetadataMaxAge time.Duration
	// BatchWindow is how long a route lets its source's records gather at
	// the brokers while records flow (it polls at most once per window)
	// and keeps its writes in the producer until every task has run the
	// poll that made them (batch.go): fewer requests and less CPU per
	// record for up to about this much added latency (batch_window). Zero:
	// off (each poll follows the last at once, and writes leave as soon as
	// they are made), as in config; negative is refused.
	BatchWindow time.Duration
	// StopTimeout bounds how long stopping a route waits for outstanding
	// outputs to be acknowledged before giving up on its final checkpoint
	// (the previous checkpoint then stays the recovery point, and the state
	// written since is discarded so the next run replays from it).
	// Required: the proxy gives its shutdown_grace.
	StopTimeout time.Duration
	// SetupTimeout bounds one attempt of a route's setup (topics, group
	// client), not the catch-up of its topic tables. Default 15s.
	SetupTimeout time.Duration
	// StateRetention drops the state of a route absent from the rule set
	// for longer than this (retention.go). Zero keeps it until dropped.
	StateRetention time.Duration
	// SourceRetry is how often a route whose source topic does not exist
	// yet looks for it again (state "waiting"). Default 5s.
	SourceRetry time.Duration
	// RecentValues keeps the key and value (their first 1 KiB) of each
	// route's recent dead letters (RecentDeadLetters, recentdl.go).
	// Default false: only their metadata and headers are kept.
	RecentValues bool
	// RedactHeader reports whether the value of a header with this name
	// is kept as "REDACTED" in the recent dead letters (admin.redact_headers);
	// nil redacts none.
	RedactHeader func(name string) bool
	// SchemaRegistry is where routes with source.format avro or protobuf
	// find their schemas, unless their rule file names its own.
	SchemaRegistry serde.Config
}

// ErrClosed is returned by Run when called on a Manager that already ran.
var ErrClosed = errors.New("pipeline: manager closed")

// Manager runs the desired set of routes.
type Manager struct {
	cfg Config
	log *slog.Logger
	met *metrics

	// db is the state store, nil until the first route opens it, or
	// opened by New when the state directory holds an earlier run's state
	// (statestore.go). dbMu serializes the open; dbClosed is set when Run
	// closes it, so no route opens it again.
	db       atomic.Pointer[state.DB]
	dbMu     sync.Mutex
	dbClosed bool

	recent recentDeadLetters // the last dead letters per route (recentdl.go)

	shared sharedClient // the instance's one non-group client (shared.go)

	applyMu sync.Mutex // serializes reconcile: one start/stop/swap at a time

	mu struct {
		sync.Mutex
		ctx     context.Context // set by Run; nil before
		closed  bool
		desired []*rules.Route
		routes  map[string]*route // running versions, by route name
		stopped map[string]*rules.Route
		// swapping are routes stopping for a new version of their rule
		// file: /routes shows them (state "reloading") until the new
		// version has started.
		swapping map[string]*route
		ruleErrs map[string]string // by absolute file
	}
}

// New returns a Manager that runs nothing until Run. It opens the state
// directory when an earlier run left state in it; otherwise the first route
// to start opens it (statestore.go).
func New(cfg Config) (*Manager, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	// The proxy's settings have their defaults in config.Default alone:
	// here a missing one is refused, never filled in.
	if cfg.SessionTimeout <= 0 {
		return nil, fmt.Errorf("pipeline: session timeout %v must be positive (group_session_timeout)", cfg.SessionTimeout)
	}
	switch cfg.GroupProtocol {
	case "auto", "consumer", "classic":
	default:
		return nil, fmt.Errorf("pipeline: group protocol %q is not one of auto, consumer, classic (group_protocol)", cfg.GroupProtocol)
	}
	if cfg.BatchWindow < 0 {
		return nil, fmt.Errorf("pipeline: batch window %v is negative; 0 is off (batch_window)", cfg.BatchWindow)
	}
	if cfg.StopTimeout <= 0 {
		return nil, fmt.Errorf("pipeline: stop timeout %v must be positive (shutdown_grace)", cfg.StopTimeout)
	}
	if cfg.MetadataMaxAge <= 0 {
		cfg.MetadataMaxAge = 10 * time.Second
	}
	if cfg.SourceRetry <= 0 {
		cfg.SourceRetry = 5 * time.Second
	}
	if cfg.SetupTimeout <= 0 {
		cfg.SetupTimeout = 15 * time.Second
	}
	if len(cfg.Seeds) == 0 {
		return nil, errors.New("pipeline: no seed brokers")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("pipeline: no state dir")
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	if cfg.SchemaRegistry.Metrics == nil {
		if cfg.SchemaRegistry.Metrics, err = serde.NewMetrics(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, met: met}
	// Opened here only when an earlier run left state (statestore.go);
	// otherwise by the first route that starts.
	held, err := holdsState(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("pipeline: open state %s: %w", cfg.StateDir, err)
	}
	if held {
		if _, err := m.openState(); err != nil {
			return nil, err
		}
	}
	if err := cfg.Registerer.Register(newCostCollector(m)); err != nil {
		m.closeState()
		return nil, fmt.Errorf("pipeline metrics: %w", err)
	}
	m.mu.routes = map[string]*route{}
	m.mu.stopped = map[string]*rules.Route{}
	m.mu.swapping = map[string]*route{}
	m.mu.ruleErrs = map[string]string{}
	return m, nil
}

// Run starts the desired routes and runs until ctx is done; then every route
// writes a final checkpoint and closes, and the state store is closed.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.mu.closed || m.mu.ctx != nil {
		m.mu.Unlock()
		return ErrClosed
	}
	m.mu.ctx = ctx
	m.mu.Unlock()
	m.reconcile()
	go m.retentionLoop(ctx)

	<-ctx.Done()

	m.applyMu.Lock()
	m.mu.Lock()
	m.mu.closed = true
	rs := make([]*route, 0, len(m.mu.routes))
	for _, r := range m.mu.routes {
		rs = append(rs, r)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() { defer wg.Done(); r.stop() }()
	}
	wg.Wait()
	m.applyMu.Unlock()
	m.shared.close()
	if err := m.closeState(); err != nil {
		if errors.Is(err, state.ErrBroken) {
			// Reported when it happened, and shown by every route since;
			// the last checkpoint on disk is where the next run starts.
			m.log.Warn("state store left unclosed: it failed earlier", "err", err)
			return nil
		}
		return fmt.Errorf("pipeline: close state: %w", err)
	}
	return nil
}

// Apply makes routes the desired set: new routes start, removed ones stop
// (final checkpoint, state kept), and a route whose content hash changed is
// swapped at a record boundary: the old version stops dispatching, drains,
// writes a final checkpoint, and the new version starts from exactly those
// offsets with the state of its unchanged steps. Apply returns once the
// changes are made (or at once, before Run).
func (m *Manager) Apply(routes []*rules.Route) {
	m.mu.Lock()
	m.mu.desired = append([]*rules.Route(nil), routes...)
	started := m.mu.ctx != nil && !m.mu.closed
	m.mu.Unlock()
	if started {
		m.reconcile()
	}
}

func (m *Manager) reconcile() {
	m.applyMu.Lock()
	defer m.applyMu.Unlock()
	m.mu.Lock()
	if m.mu.closed {
		m.mu.Unlock()
		return
	}
	ctx := m.mu.ctx
	want := map[string]*rules.Route{}
	for _, d := range m.mu.desired {
		want[d.Name] = d
	}
	var stop []*route
	var start []*rules.Route
	// was: the version before of each route that starts again, swapped
	// or removed earlier (its sinks' series are still on the registry).
	was := map[string]*rules.Route{}
	for name, r := range m.mu.routes {
		d, ok := want[name]
		if !ok {
			stop = append(stop, r)
			delete(m.mu.routes, name)
			m.mu.stopped[name] = r.def
			continue
		}
		if d.Hash != r.def.Hash {
			stop = append(stop, r)
			delete(m.mu.routes, name)
			m.mu.swapping[name] = r
			start = append(start, d)
			was[name] = r.def
		}
	}
	for name, d := range want {
		if _, ok := m.mu.routes[name]; !ok && !containsRoute(start, name) {
			start = append(start, d)
			if old, ok := m.mu.stopped[name]; ok {
				was[name] = old
			}
		}
	}
	m.mu.Unlock()

	// Stopping first keeps the swap exact: the new version loads the old
	// version's final checkpoint.
	var wg sync.WaitGroup
	for _, r := range stop {
		wg.Add(1)
		go func() { defer wg.Done(); r.stop() }()
	}
	wg.Wait()
	for _, d := range start {
		// The sinks the new version no longer has: the old version has
		// stopped (nothing counts on them any more), so their series go
		// before the new one runs; a sink that stays keeps its series,
		// and the new version's outlets count on in them.
		if old := was[d.Name]; old != nil {
			m.met.forgetSinks(d.Name, goneSinks(old, d))
		}
		r := newRoute(m, d)
		m.mu.Lock()
		m.mu.routes[d.Name] = r
		delete(m.mu.stopped, d.Name)
		delete(m.mu.swapping, d.Name)
		m.mu.Unlock()
		r.start(ctx)
	}
}

// restartRoute stops r and starts its rule again, unless r was replaced or
// stopped meanwhile. Setup retries with backoff, so a restart that fails
// again waits before the next try.
func (m *Manager) restartRoute(r *route) {
	m.applyMu.Lock()
	defer m.applyMu.Unlock()
	m.mu.Lock()
	if m.mu.closed || m.mu.routes[r.name] != r {
		m.mu.Unlock()
		return
	}
	ctx := m.mu.ctx
	delete(m.mu.routes, r.name)
	m.mu.swapping[r.name] = r
	m.mu.Unlock()
	r.stop()
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Second):
	}
	n := newRoute(m, r.def)
	m.mu.Lock()
	if m.mu.closed {
		m.mu.Unlock()
		return
	}
	m.mu.routes[r.name] = n
	delete(m.mu.swapping, r.name)
	m.mu.Unlock()
	n.start(ctx)
}

func containsRoute(rs []*rules.Route, name string) bool {
	for _, r := range rs {
		if r.Name == name {
			return true
		}
	}
	return false
}

// SetRuleErrors records the current rule-file errors; Status shows each next
// to the route of the same file until the next call clears it.
func (m *Manager) SetRuleErrors(errs []error) {
	byFile := map[string]string{}
	for _, err := range errs {
		if err == nil {
			continue
		}
		file := errorFile(err)
		if prev := byFile[file]; prev != "" {
			byFile[file] = prev + "; " + err.Error()
		} else {
			byFile[file] = err.Error()
		}
	}
	m.mu.Lock()
	m.mu.ruleErrs = byFile
	m.mu.Unlock()
}

// RouteStatus is one route in Status.
type RouteStatus struct {
	Name           string            `json:"name"`
	File           string            `json:"file"`
	Source         string            `json:"source"`
	Sink           string            `json:"sink"`            // every sink's target, comma separated
	Sinks          []SinkStatus      `json:"sinks,omitempty"` // one, or a switch's branches, with counts
	State          string            `json:"state"`           // starting, waiting, running, stopped, error
	Partitions     []PartitionStatus `json:"partitions"`
	Watermark      *time.Time        `json:"watermark,omitempty"`
	LastCheckpoint *time.Time        `json:"last_checkpoint,omitempty"`
	LastError      string            `json:"last_error,omitempty"`
	// Group is the route's consumer group; Generation its generation as
	// this instance last joined it; Owned every partition this instance
	// owns in it (the source's and the repartition topics').
	Group      string           `json:"group,omitempty"`
	Protocol   string           `json:"group_protocol,omitempty"` // consumer (KIP-848) or classic
	Generation int32            `json:"generation"`
	Owned      []OwnedPartition `json:"owned"`
	// Assignment is every partition of the route's topics with its owner
	// in the group (refreshed every 5 s), when the group could be
	// described; AssignmentError says why not.
	Assignment      []PartitionOwner `json:"assignment,omitempty"`
	AssignmentError string           `json:"assignment_error,omitempty"`
	Restore         RestoreStatus    `json:"restore"`
	// CheckpointPauseMs is how long the last checkpoint held dispatch at a
	// record boundary; MaxCheckpointPauseMs the longest since the start.
	CheckpointPauseMs    float64 `json:"checkpoint_pause_ms"`
	MaxCheckpointPauseMs float64 `json:"max_checkpoint_pause_ms"`
	RuleError            string  `json:"rule_error,omitempty"`
	// Delivery is the sink's guarantee (at_least_once, exactly_once);
	// Transaction the state of an exactly-once route's transactions.
	Delivery    string     `json:"delivery,omitempty"`
	Transaction *TxnStatus `json:"transaction,omitempty"`
	// TappedRecords are the source records this instance's version of the
	// route processed from the produce path; TappedShare their share of
	// every source record it processed.
	TappedRecords int64   `json:"tapped_records"`
	TappedShare   float64 `json:"tapped_share"`
	// RecordsIn are the records this instance's version of the route read
	// from every topic it reads (its source, and the second topic of each
	// stream join), as rtproxy_pipeline_records_in_total summed over its
	// partitions; RecordsInByTopic the same per topic.
	RecordsIn        int64            `json:"records_in"`
	RecordsInByTopic map[string]int64 `json:"records_in_by_topic,omitempty"`
}

// OwnedPartition is one partition a route's instance owns in its group.
type OwnedPartition struct {
	Topic      string `json:"topic"`
	Partition  int32  `json:"partition"`
	DoneOffset int64  `json:"done_offset"`
	Lag        int64  `json:"lag"`
	// Watermark is the partition's event-time watermark in timed routes:
	// for a source partition, the newest event time minus the allowed
	// lateness (what it hands on); for a keyed step's partition, the
	// watermark its windows close by.
	Watermark *time.Time `json:"watermark,omitempty"`
	// HeldBy is, for a keyed step's partition that keeps a watermark, the
	// upstream partition holding it back: the writer (a source partition,
	// or a partition of the keyed step before) with the lowest frontier
	// among those not idle. A partition stuck behind the others names the
	// writer whose frontier does not reach it.
	HeldBy *WatermarkHolder `json:"watermark_held_by,omitempty"`
}

// WatermarkHolder is the upstream partition a keyed partition's watermark
// waits for.
type WatermarkHolder struct {
	// Writer is the writer's partition: of the source topic for the first
	// keyed step, of the previous keyed step's repartition topic after it.
	Writer int32 `json:"writer"`
	// Frontier is the writer's newest frontier this partition has heard
	// (records and markers); nil when it has heard nothing from it yet.
	Frontier *time.Time `json:"frontier,omitempty"`
	// LastHeard is when this partition last heard from that writer.
	LastHeard *time.Time `json:"last_heard,omitempty"`
}

// PartitionOwner is which member of the route's group owns one partition
// of the route's topics, as the group's coordinator last described it.
type PartitionOwner struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Owner     string `json:"owner"` // client host and member id
	Self      bool   `json:"self"`  // this instance
}

// RestoreStatus says whether keyed state is being rebuilt from changelog
// topics, and how much was since the route started.
type RestoreStatus struct {
	State   string  `json:"state"` // idle, restoring
	Records int64   `json:"records"`
	Seconds float64 `json:"seconds"`
}

// PartitionStatus is one source partition of a route that this instance
// owns.
type PartitionStatus struct {
	Partition     int32      `json:"partition"`
	DoneOffset    int64      `json:"done_offset"`
	HighWatermark int64      `json:"high_watermark"`
	Lag           int64      `json:"lag"`
	Watermark     *time.Time `json:"watermark,omitempty"` // event time, timed routes
}

// Status returns []RouteStatus (sorted by name) for the admin /routes page.
func (m *Manager) Status() any { return m.Routes() }

// Routes is Status with its concrete type.
func (m *Manager) Routes() []RouteStatus {
	m.mu.Lock()
	rs := make([]*route, 0, len(m.mu.routes))
	for _, r := range m.mu.routes {
		rs = append(rs, r)
	}
	var swapping []*route
	for name, r := range m.mu.swapping {
		if m.mu.routes[name] == nil {
			swapping = append(swapping, r)
		}
	}
	var out []RouteStatus
	seenFile := map[string]bool{}
	for _, d := range m.mu.stopped {
		out = append(out, RouteStatus{Name: d.Name, File: d.File, Source: d.Source.Topic, Sink: sinkText(d),
			State: "stopped", Partitions: []PartitionStatus{}})
	}
	ruleErrs := m.mu.ruleErrs
	m.mu.Unlock()
	for _, r := range rs {
		out = append(out, r.status())
	}
	for _, r := range swapping {
		st := r.status()
		st.State = "reloading"
		out = append(out, st)
	}
	for i := range out {
		seenFile[out[i].File] = true
		if e, ok := ruleErrs[out[i].File]; ok {
			out[i].RuleError = e
		}
	}
	// A file that never compiled has no route; show its error on its own.
	for file, e := range ruleErrs {
		if !seenFile[file] {
			out = append(out, RouteStatus{File: file, State: "error", RuleError: e, Partitions: []PartitionStatus{}})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].File < out[j].File
	})
	return out
}

// errorFile finds the rule file an error names.
func errorFile(err error) string {
	var re *rules.Error
	if errors.As(err, &re) {
		return re.File
	}
	var el rules.ErrorList
	if errors.As(err, &el) && len(el) > 0 {
		return el[0].File
	}
	return ""
}
