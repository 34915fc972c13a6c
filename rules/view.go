package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/rtproxy/rtproxy/internal/jsoncodec"
	"github.com/rtproxy/rtproxy/operators"
)

// A view file (top-level key `view` instead of `route` or `guard`) is a
// topic as some clients fetch it: under a name of its own (a virtual
// topic) or under the real topic's name (in-place masking, for the clients
// it names only), with per-record steps (filter, set, map, drop) run on
// every record those clients fetch. rules parses and validates view files
// and runs their steps (View.Run); protocol/ applies them on the fetch
// path (protocol.Views), cmd/rtproxy binds the two.

// View is the content of a view file. A loaded View is complete: every
// default is filled in. Its Route has Name (the name clients use), File,
// Hash and Steps (the compiled steps); Source.Members and DecodeMembers
// say what the steps read of a JSON value.
type View struct {
	Topic  string // the real topic the view reads
	Format Format // FormatJSON or FormatRaw
	// Clients are who the view applies to; nil: every client (a virtual
	// name only: an in-place view must name its clients).
	Clients *ViewClients
	// SaltFile is the file hash() keys its HMAC with (hash_salt_file, its
	// path resolved); "" when the view has none (then no expression calls
	// hash).
	SaltFile string
	salt     []byte
	// Members are the top-level members of a JSON object value the steps
	// read, when the loader could name them all: Run decodes only those
	// (operators.Record.SetJSONMembers) and splices what it changed back
	// into the rest. Nil: decode the value whole.
	Members jsoncodec.Fields
	// Closed is set on the stand-in the watcher puts in force for a view
	// file that is invalid and has no valid version to keep (at start, or
	// a new file): the view fails closed, every record it would serve is
	// an error (the proxy sends its placeholder, never the original),
	// for every client, until the file is fixed.
	Closed string

	steps []operators.Step // built once at load: filter, set, map, drop keep no state
}

// ViewClients is a view's `clients:` list. A client is one the view
// applies to when any entry matches: its client.id one of ClientID, its
// SASL principal one of Principal, its TLS certificate's subject one of
// TLSSubject. Each entry is exact text or a glob: `*` matches any run of
// characters (`/` included), `?` one character, nothing else is special.
// An empty principal or subject (no SASL, no client certificate) matches
// no entry.
type ViewClients struct {
	ClientID   []string
	Principal  []string
	TLSSubject []string
}

// Values and bounds of a view file.
const (
	// viewStepKinds are the step kinds a view may use: they work on one
	// record at a time and keep no state.
	viewStepKinds = "filter, set, map, drop"
	// MinSaltBytes and MaxSaltBytes bound a hash_salt_file's content.
	MinSaltBytes = 16
	MaxSaltBytes = 4096
	// maxViewClients bounds the entries of each list of `clients`.
	maxViewClients = 1000
	maxClientEntry = 1024
)

var allowedViewSteps = []string{"filter", "set", "map", "drop"}

// The keys of a view file and of its clients list.
var (
	viewKeys       = []string{"view", "topic", "clients", "format", "steps", "hash_salt_file"}
	viewClientKeys = []string{"client_id", "principal", "tls_subject"}
)

// InPlace reports whether the view masks the real topic under its own
// name (for the clients it names) rather than serving a virtual topic.
func (r *Route) InPlace() bool { return r.View != nil && r.Name == r.View.Topic }

// isViewFile reports whether root is a view file: it has `view`. A file
// with `view` and `route` or `guard` is refused here.
func (l *loader) isViewFile(root *yaml.Node) (view, refused bool) {
	v := mappingKey(root, "view")
	if v == nil {
		return false, false
	}
	for _, other := range []string{"route", "guard"} {
		if mappingKey(root, other) != nil {
			l.errAt(v, "view", "a rule file is a route (`route:`), a guard (`guard:`) or a view (`view:`), not two of them; put the view in a file of its own")
			return false, true
		}
	}
	return true, false
}

// loadView loads a view file whose root mapping is root.
func (l *loader) loadView(root *yaml.Node) *Route {
	l.res.view = true
	f := l.fields(root, viewKeys, "view file")
	r := &Route{Tables: map[string]TableSpec{}, at: map[string]position{}}
	if abs, err := filepath.Abs(l.file); err == nil {
		r.File = abs
	} else {
		r.File = l.file
	}
	v := &View{Format: DefaultFormat}
	r.View = v

	nameOK := false
	if kv := f["view"]; kv == nil {
		l.errAt(root, "", "missing `view`: the topic name clients fetch, e.g. `view: payments.for-analytics`")
	} else if name, ok := l.topicName(kv, "view"); ok {
		l.res.name, l.res.nameNode = name, position{kv.val.Line, kv.val.Column}
		r.at["view"] = l.res.nameNode
		r.at["route"] = l.res.nameNode
		r.Name, nameOK = name, true
	} else if kv.val.Kind == yaml.ScalarNode {
		l.res.nameNode = position{kv.val.Line, kv.val.Column}
	}

	topicOK := false
	if kv := f["topic"]; kv == nil {
		l.errAt(root, "", "missing `topic`: the real topic the view reads, e.g. `topic: payments`")
	} else if t, ok := l.topicName(kv, "topic"); ok {
		v.Topic, topicOK = t, true
		l.res.viewTopic = t
		r.at["topic"] = position{kv.val.Line, kv.val.Column}
	}

	if kv := f["format"]; kv != nil {
		s, ok := l.oneOf(kv, "format", string(FormatJSON), string(FormatRaw), string(FormatAvro), string(FormatProtobuf))
		switch {
		case !ok:
		case Format(s).Registry():
			l.errAt(kv.val, s, "a view reads format json or raw; format %s (through a schema registry) is not supported in views yet: serve a route's JSON output topic instead", s)
		default:
			v.Format = Format(s)
		}
	}

	if kv := f["clients"]; kv != nil {
		v.Clients = l.viewClients(kv)
	} else if nameOK && topicOK && r.Name == v.Topic {
		l.errAt(f["view"].val, r.Name, "view `%s` is in place (its name is its topic), so it must name the clients it applies to under `clients:` (client_id, principal or tls_subject): without a list it would change the topic for every client of the proxy. Name them, or give the view a name of its own (e.g. `%s.masked`)", r.Name, r.Name)
	}

	if kv := f["hash_salt_file"]; kv != nil {
		l.viewSalt(kv, v)
	}

	r.Source.Topic, r.Source.Format = v.Topic, v.Format
	l.hashOK = len(v.salt) > 0
	l.viewSteps(f["steps"], r)
	v.Members = nil
	if r.Source.DecodeMembers {
		v.Members = jsoncodec.Fields{}
		for _, m := range r.Source.Members {
			v.Members[m] = struct{}{}
		}
	}
	if nameOK && topicOK && r.Name == v.Topic && len(r.Steps) == 0 && len(l.errs) == 0 {
		l.errAt(f["view"].val, r.Name, "in-place view `%s` has no `steps`: its clients would fetch the topic unchanged. Add the steps that filter or mask it", r.Name)
	}
	if len(l.errs) > 0 {
		return nil
	}
	for _, s := range r.Steps {
		st, err := s.Build(operators.BuildEnv{})
		if err != nil {
			l.errAtPos(s.Line, s.Col, s.Kind, "%s: %v", s.Kind, err)
			return nil
		}
		v.steps = append(v.steps, st)
	}
	r.Hash = l.hash(r)
	return r
}

// viewSteps compiles a view's steps: only per-record kinds.
func (l *loader) viewSteps(kv *keyVal, r *Route) {
	if kv != nil && kv.val.Kind == yaml.SequenceNode {
		keep := &yaml.Node{Kind: yaml.SequenceNode, Tag: kv.val.Tag, Line: kv.val.Line, Column: kv.val.Column}
		for _, item := range kv.val.Content {
			it := resolve(item)
			if it.Kind == yaml.MappingNode && len(it.Content) >= 2 {
				k := resolve(it.Content[0])
				if operators.SpecOf(k.Value) != nil && !contains(allowedViewSteps, k.Value) {
					l.errAt(k, k.Value, "a view runs per-record steps only (%s): `%s` %s. Run it in a route that writes a topic, and make a view of that topic", viewStepKinds, k.Value, whyNotInView(k.Value))
					continue
				}
			}
			keep.Content = append(keep.Content, item)
		}
		kv = &keyVal{key: kv.key, val: keep}
	}
	l.steps(kv, r)
}

// whyNotInView says why a step kind cannot run in a view.
func whyNotInView(kind string) string {
	switch kind {
	case "window", "drop_duplicates":
		return "keeps state across records, which a fetch (served again from any offset, to any client) cannot"
	case "explode":
		return "makes several records of one, but a fetched record keeps its offset and cannot become several"
	case "join":
		return "reads a table, which a view does not have"
	}
	return "is not a per-record step"
}

// viewClients reads `clients:`.
func (l *loader) viewClients(kv *keyVal) *ViewClients {
	if !l.mapping(kv, "clients", "`clients: { client_id: [\"analytics-*\"] }`") {
		return nil
	}
	f := l.fields(kv.val, viewClientKeys, "clients")
	c := &ViewClients{}
	for _, k := range viewClientKeys {
		x := f[k]
		if x == nil {
			continue
		}
		list := l.clientList(x, "clients."+k)
		switch k {
		case "client_id":
			c.ClientID = list
		case "principal":
			c.Principal = list
		case "tls_subject":
			c.TLSSubject = list
		}
	}
	if len(c.ClientID)+len(c.Principal)+len(c.TLSSubject) == 0 {
		if len(f) == 0 {
			l.errAt(kv.key, "clients", "`clients` names no client; list `client_id`, `principal` or `tls_subject` patterns, or remove `clients` (a virtual view then applies to every client)")
		}
		return nil
	}
	return c
}

// clientList reads one list of client patterns (a single text is a list
// of one).
func (l *loader) clientList(x *keyVal, what string) []string {
	items := x.val.Content
	switch {
	case x.val.Kind == yaml.ScalarNode && x.val.ShortTag() != "!!null":
		items = []*yaml.Node{x.val}
	case x.val.Kind != yaml.SequenceNode || len(x.val.Content) == 0:
		l.errAt(x.val, what, "`%s` must be a list of names or globs, e.g. `%s: [\"analytics-*\"]`", what, what)
		return nil
	}
	if len(items) > maxViewClients {
		l.errAt(x.val, what, "`%s` lists %d entries, more than %d; use globs", what, len(items), maxViewClients)
		return nil
	}
	var out []string
	for _, it := range items {
		it = resolve(it)
		switch {
		case it.Kind != yaml.ScalarNode || it.ShortTag() == "!!null" || it.Value == "":
			l.errAt(it, "", "each entry of `%s` is a name or glob (text, not empty)", what)
		case len(it.Value) > maxClientEntry || strings.ContainsAny(it.Value, "\r\n\x00"):
			l.errAt(it, it.Value, "an entry of `%s` is one line of at most %d bytes", what, maxClientEntry)
		case contains(out, it.Value):
			l.errAt(it, it.Value, "`%s` is listed twice in `%s`; keep one", it.Value, what)
		default:
			out = append(out, it.Value)
		}
	}
	return out
}

// viewSalt reads hash_salt_file: a file inside the rules directory or
// allowed by rules.allow.files, a regular file of MinSaltBytes to
// MaxSaltBytes (trailing whitespace, a final newline, is not part of the
// salt). The file is watched like a table file: a new salt reloads the
// view.
func (l *loader) viewSalt(kv *keyVal, v *View) {
	p, ok := l.scalar(kv, "hash_salt_file")
	if !ok {
		return
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(l.dir, p)
	}
	if err := l.opts.Allow.In(l.dir).File(p); err != nil {
		l.errAt(kv.val, kv.val.Value, "hash_salt_file: %v", err)
		return
	}
	salt, err := readSalt(p)
	if err != nil {
		l.errAt(kv.val, kv.val.Value, "hash_salt_file: %v", err)
		return
	}
	v.SaltFile, v.salt = p, salt
	l.res.tableFiles = append(l.res.tableFiles, p) // watched and hashed like a table file
}

// readSalt reads a salt file, bounded, never blocking on a FIFO. Errors
// never carry the file's content.
func readSalt(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %v", p, unwrapPathError(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %v", p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", p, fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSaltBytes+2))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %v", p, err)
	}
	b = bytes.TrimRight(b, " \t\r\n")
	switch {
	case len(b) > MaxSaltBytes:
		return nil, fmt.Errorf("%s holds more than %d bytes; a salt is 16 to %d bytes (e.g. `head -c 32 /dev/urandom | base64 > salt`)", p, MaxSaltBytes, MaxSaltBytes)
	case len(b) < MinSaltBytes:
		return nil, fmt.Errorf("%s holds %d bytes, fewer than %d: a short salt can be guessed, and with it every hashed value tested; write at least 16 random bytes (e.g. `head -c 32 /dev/urandom | base64 > salt`)", p, len(b), MinSaltBytes)
	}
	return b, nil
}

// noHash refuses an expression calling hash() in a file without a salt.
func (l *loader) noHash(n *yaml.Node, src string) {
	what := "this route"
	if l.res.view {
		what = "this view has no `hash_salt_file`"
	} else if l.res.guard {
		what = "this guard"
	}
	if l.res.view {
		l.errAt(n, src, "hash() needs a salt, and %s: add `hash_salt_file: FILE` (16 or more random bytes, a file inside the rules directory or in rules.allow.files), or use mask() instead", what)
		return
	}
	l.errAt(n, src, "hash() is keyed with a view's salt, and %s is not a view: use hash() in a view file with `hash_salt_file`", what)
}

// ViewClientMatch is who is fetching, as a view's client list sees it.
type ViewClientMatch struct {
	ClientID, Principal, TLSSubject string
}

// AppliesTo reports whether v applies to the client c.
func (v *View) AppliesTo(c ViewClientMatch) bool {
	if v.Clients == nil {
		return true
	}
	for _, p := range v.Clients.ClientID {
		if globMatch(p, c.ClientID) {
			return true
		}
	}
	if c.Principal != "" {
		for _, p := range v.Clients.Principal {
			if globMatch(p, c.Principal) {
				return true
			}
		}
	}
	if c.TLSSubject != "" {
		for _, p := range v.Clients.TLSSubject {
			if globMatch(p, c.TLSSubject) {
				return true
			}
		}
	}
	return false
}

// globMatch matches s against p, where `*` is any run of bytes and `?`
// one character. It runs in O(len(p)·len(s)) at worst (no backtracking
// blow-up).
func globMatch(p, s string) bool {
	px, sx := 0, 0
	nextP, nextS := -1, -1
	for px < len(p) || sx < len(s) {
		if px < len(p) {
			switch c := p[px]; c {
			case '*':
				nextP, nextS = px, sx+1
				px++
				continue
			case '?':
				if sx < len(s) {
					_, w := decodeRune(s[sx:])
					px++
					sx += w
					continue
				}
			default:
				if sx < len(s) && s[sx] == c {
					px++
					sx++
					continue
				}
			}
		}
		if nextS > 0 && nextS <= len(s) {
			px, sx = nextP, nextS
			continue
		}
		return false
	}
	return true
}

func decodeRune(s string) (rune, int) { return utf8.DecodeRuneInString(s) }

// ViewRecord is one fetched record on its way through a view: the caller
// sets Topic, Partition, Offset, Key, Raw (the value bytes, nil for a null
// value), Headers and Timestamp.
type ViewRecord = operators.Record

// ErrViewClosed is the error of every record of a view that fails closed.
var ErrViewClosed = errors.New("view fails closed")

// Run runs v's steps on one fetched record r, whose Raw is the value as
// stored, and returns the value the client gets (appended to dst; nil for
// a null value) and whether the record passes (false: a filter dropped
// it). An error means the record could not be processed: the value does
// not decode as the view's format, or a step failed (an expression error,
// a budget); the caller must then not pass the original through. Run never
// panics, and it is safe for concurrent use by many goroutines, each with
// its own record. r.Value is the value the steps left.
//
// A null value (a tombstone) has nothing to mask or filter on: it passes
// as it is, with no step run, so a compacted topic's deletes reach the
// view's clients (a view never changes keys or headers).
func (v *View) Run(r *ViewRecord, dst []byte) (out []byte, keep bool, err error) {
	if v.Closed != "" {
		return nil, false, fmt.Errorf("%w: %s", ErrViewClosed, v.Closed)
	}
	defer func() {
		if p := recover(); p != nil {
			out, keep, err = nil, false, &ViewError{Msg: "an internal error in the view", Detail: fmt.Sprint(p)}
		}
	}()
	raw := r.Raw
	if raw == nil {
		return nil, true, nil
	}
	r.ResetEnv()
	r.HashKey = v.salt
	switch {
	case v.Format == FormatRaw:
		r.Value = string(raw)
	case v.Members != nil:
		if err := r.SetJSONMembers(raw, v.Members); err != nil {
			return nil, false, viewNotJSON(raw, err)
		}
	default:
		if err := r.SetJSON(raw); err != nil {
			return nil, false, viewNotJSON(raw, err)
		}
	}
	var em viewEmitter
	for i, st := range v.steps {
		em = viewEmitter{}
		st.Process(r, &em)
		switch {
		case em.err != nil:
			return nil, false, stepError(i, st.Kind(), em.reason, em.err)
		case em.out == nil:
			return nil, false, nil
		}
		r = em.out
	}
	if dst == nil {
		dst = []byte{} // a value, even if empty: not a null
	}
	if v.Format == FormatRaw {
		if s, ok := r.Value.(string); ok {
			return append(dst, s...), true, nil
		}
	}
	if v.Format == FormatRaw {
		out, err = jsoncodec.Append(dst, r.Value)
	} else {
		out, err = r.EncodeValue(dst)
	}
	if err != nil {
		return nil, false, &ViewError{Msg: "the value the steps made cannot be encoded as JSON", Detail: err.Error()}
	}
	return out, true, nil
}

// viewNotJSON is the error of a value a json view cannot decode. A value
// in the Confluent wire format (a zero byte, then a 4-byte schema id:
// Avro, Protobuf or JSON Schema values written through a schema registry)
// is named as such, with its schema id, so that the reader of the
// placeholder knows why: views read json or raw values only.
func viewNotJSON(raw []byte, err error) *ViewError {
	if len(raw) >= 5 && raw[0] == 0 {
		id := uint32(raw[1])<<24 | uint32(raw[2])<<16 | uint32(raw[3])<<8 | uint32(raw[4])
		return &ViewError{Msg: fmt.Sprintf("the value is not valid JSON: it is in the Confluent wire format (schema id %d: Avro, Protobuf or JSON Schema through a schema registry), which a view (format json or raw) does not decode", id),
			Detail: notJSON(err)}
	}
	return &ViewError{Msg: "the value is not valid JSON", Detail: notJSON(err)}
}

// viewEmitter takes what one step of a view makes of a record: at most
// one record (the kinds views allow never make more), or an error.
type viewEmitter struct {
	out    *operators.Record
	err    error
	reason operators.Reason
}

func (e *viewEmitter) Emit(r *operators.Record) { e.out = r }

func (e *viewEmitter) DeadLetter(_ *operators.Record, reason operators.Reason, err error) {
	e.err, e.reason = err, reason
}

// ViewError is why a view could not process a record. Its Error is what
// the record's client is told (the placeholder's rtproxy-view-error
// header): what failed and where, never a value of the record, because
// that client is the one the view hides the values from; an expression's
// own message renders the values it failed on (`int(4111-…)`), so it is
// withheld. Detail is the full text, for the rule's author (`rtproxy
// test`); it may hold record values.
type ViewError struct {
	Msg    string
	Detail string
}

func (e *ViewError) Error() string { return e.Msg }

// stepError is the ViewError of step i (from 0) failing with reason.
func stepError(i int, kind string, reason operators.Reason, err error) *ViewError {
	what := "an expression failed on this record"
	switch {
	case reason == operators.ReasonBudget || operators.IsBudget(err):
		what = "over a per-record budget (" + budgetKey(operators.BudgetOf(err)) + ")"
	case strings.Contains(err.Error(), "internal error"):
		what = "an internal error"
	case (kind == "set" || kind == "drop") && strings.HasPrefix(err.Error(), kind+": value is ") && strings.HasSuffix(err.Error(), "not an object"):
		what = "the value is not an object"
	}
	return &ViewError{Msg: fmt.Sprintf("step %d (%s) failed: %s", i+1, kind, what), Detail: err.Error()}
}

// budgetKey is the config key of a budget.
func budgetKey(name string) string {
	switch name {
	case operators.BudgetExprSteps:
		return "limits.expr_steps"
	case operators.BudgetExprTime:
		return "limits.expr_time"
	case operators.BudgetFanOut:
		return "limits.max_fanout"
	case operators.BudgetOpenWindows:
		return "limits.max_open_windows"
	}
	return "limits.expr_memory_bytes"
}

// guessView reads, from the lines of a file whose YAML does not parse,
// whether it is a view file (a top-level `view:` line), its name and its
// topic ("" when not readable): an in-place view that does not load fails
// closed, so the proxy must know it is one even when the YAML is broken.
func guessView(lines []string) (view bool, name, topic string) {
	for _, ln := range lines {
		k, v, ok := strings.Cut(strings.TrimRight(ln, "\r"), ":")
		if !ok || k != strings.TrimSpace(k) {
			continue
		}
		if i := strings.Index(v, " #"); i >= 0 {
			v = v[:i]
		}
		v = strings.Trim(strings.TrimSpace(v), `"'`)
		switch k {
		case "view":
			view = true
			if topicNameRe.MatchString(v) {
				name = v
			}
		case "topic":
			if topicNameRe.MatchString(v) {
				topic = v
			}
		}
	}
	if !view {
		return false, "", ""
	}
	return view, name, topic
}

// closedView is the stand-in put in force for a view file with nothing
// valid to run (View.Closed): every record it serves is an error, so the
// clients see the proxy's placeholder and never the original. Its client
// list is unknown, so it applies to every client. Without a name and a
// topic there is nothing to stand in for (nil): a virtual name that does
// not load does not exist, which shows nothing.
func closedView(file, name, topic, contentHash string) *Route {
	if name == "" || topic == "" {
		return nil
	}
	msg := fmt.Sprintf("view `%s` does not load and has no valid version to keep, so it fails closed: every record of it is withheld until its file is fixed (the proxy's /routes and log say what is wrong)", name)
	return &Route{Name: name, File: file, Hash: "closed:" + contentHash,
		View: &View{Topic: topic, Format: FormatRaw, Closed: msg}}
}

// ViewSummary says in a few words what a view file is: "topic payments
// in place for 2 client patterns, 2 steps".
func (r *Route) ViewSummary() string {
	v := r.View
	if v == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "topic %s", v.Topic)
	if r.InPlace() {
		b.WriteString(" in place")
	}
	if v.Clients == nil {
		b.WriteString(", every client")
	} else {
		n := len(v.Clients.ClientID) + len(v.Clients.Principal) + len(v.Clients.TLSSubject)
		fmt.Fprintf(&b, ", %d client %s", n, plural(n, "pattern", "patterns"))
	}
	fmt.Fprintf(&b, ", %d %s", len(r.Steps), plural(len(r.Steps), "step", "steps"))
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// ViewErrorHeader is the one header of the placeholder a client gets for a
// record its view could not process (the value is null; the header says
// why). protocol.ViewErrorHeader on the fetch path is the same name;
// `rtproxy test` shows view tests the same placeholder.
const ViewErrorHeader = "rtproxy-view-error"
