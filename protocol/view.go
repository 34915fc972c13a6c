package protocol

// Views on the fetch path (a view rule file, rules.View). A view is a
// topic as some clients see it: under a name of its own (a virtual topic)
// or under the real topic's name (in-place masking, for the clients the
// view names only), with per-record steps (filter, set, map) applied to
// what those clients fetch. Records keep their offsets: a record a view
// filters out leaves a gap, as compaction does.
//
// The proxy reads the set in force once per request (SetViews swaps it on
// reload), so a request sees one set from start to end.

import "github.com/twmb/franz-go/pkg/kmsg"

// Views are the views in force.
type Views interface {
	// Lookup returns the view a client fetching topic name (as the client
	// names it) sees, or nil: then name is a real topic fetched as stored.
	Lookup(name string, c ViewClient) View
	// Virtual returns the names of the virtual topics of views that apply
	// to c, with the real topic each one reads (Metadata lists them with
	// the real topic's partitions).
	Virtual(c ViewClient) map[string]string
}

// ViewClient is who is fetching: what a view's client list matches on.
type ViewClient struct {
	ClientID   string
	Principal  string // the SASL principal as Kafka writes it ("User:alice"); "" without SASL
	TLSSubject string // the client certificate's subject; "" without a client certificate
}

// View is one view.
type View interface {
	// Name is the topic name clients use: a virtual name, or the real
	// topic's for in-place masking.
	Name() string
	// Topic is the real topic the view reads.
	Topic() string
	// Apply runs the view's steps on one record. It may replace
	// rec.Value and rec.Headers (never the slices' contents in place: they
	// alias the fetched batch); the new value may be built in
	// rec.Scratch, a buffer of the caller's that it encodes the record
	// from before the next Apply and then reuses (Apply may leave a larger
	// one there). keep false filters the record out. An
	// error means the record could not be processed (not decodable, an
	// expression failed): the proxy then never passes the original value
	// through, and replaces it with a placeholder, saying why in a header.
	Apply(rec *ViewRecord) (keep bool, err error)
}

// ViewRecord is one fetched record as a view sees it.
type ViewRecord struct {
	Partition int32
	Offset    int64
	Timestamp int64  // epoch millis
	Key       []byte // nil: a null key
	Value     []byte // nil: a null value
	Headers   []kmsg.Header
	// Scratch is the caller's buffer for the new value (see Apply).
	Scratch []byte
}
