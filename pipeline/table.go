package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/rtproxy/rtproxy/operators"
	"github.com/rtproxy/rtproxy/rules"
)

// topicTable feeds a join table from a (usually compacted) topic: the
// record key is the row key, the JSON value the row, a tombstone deletes it.
// The rows live in the state store (storeTable), rebuilt from the topic's
// start whenever the route starts.
type topicTable struct {
	topic  string
	cl     *kgo.Client
	table  *storeTable
	cancel context.CancelFunc
	done   chan struct{}
}

// openTopicTable reads the table topic from its start to the high
// watermarks it had when called, then follows it in the background.
func openTopicTable(ctx, catchUp context.Context, r *route, base []kgo.Opt, adm *kadm.Client, ts rules.TableSpec) (*topicTable, error) {
	starts, err := adm.ListStartOffsets(ctx, ts.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("route %q table %s: list offsets of %s: %w", r.name, ts.Name, ts.Topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, ts.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("route %q table %s: list offsets of %s: %w", r.name, ts.Name, ts.Topic, err)
	}
	next := map[int32]int64{}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	starts.Each(func(o kadm.ListedOffset) { next[o.Partition] = o.Offset })
	if len(end) == 0 {
		return nil, fmt.Errorf("route %q table %s: topic %s not found", r.name, ts.Name, ts.Topic)
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), base...),
		kgo.ConsumeTopics(ts.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Rows of aborted transactions are not rows; and the commit or
		// abort markers are handed over (and skipped below), so that a
		// partition that ends in one is seen to reach its end.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(fetchMaxWait),
	)...)
	if err != nil {
		return nil, err
	}
	rows := r.m.store().Rows(r.name, ts.Name)
	if err := rows.Reset(); err != nil {
		cl.Close()
		return nil, fmt.Errorf("route %q table %s: %w", r.name, ts.Name, err)
	}
	tt := &topicTable{topic: ts.Topic, cl: cl, table: newStoreTable(rows, tableCacheRows), done: make(chan struct{})}
	skipped := func(rec *kgo.Record, err error) {
		// The row's bytes may be in err (a decode error): shown without them.
		shown := r.shownError(err, &operators.Record{Key: rec.Key, Raw: rec.Value})
		r.noteError(fmt.Errorf("table %s: row %s/%d/%d skipped: %s", ts.Name, rec.Topic, rec.Partition, rec.Offset, shown))
	}
	caught := func() bool {
		for p, e := range end {
			if next[p] < e {
				return false
			}
		}
		return true
	}
	var total, read int64
	for p, e := range end {
		total += e - next[p]
	}
	began, logged := time.Now(), time.Now()
	for !caught() {
		fs := cl.PollFetches(catchUp)
		if catchUp.Err() != nil {
			cl.Close()
			return nil, fmt.Errorf("route %q table %s: reading %s: %w", r.name, ts.Name, ts.Topic, catchUp.Err())
		}
		read += int64(fs.NumRecords())
		if time.Since(logged) >= 5*time.Second {
			logged = time.Now()
			r.log.Info("topic table catching up", "table", ts.Name, "topic", ts.Topic, "records", read, "of", total,
				"elapsed", time.Since(began).Round(time.Millisecond))
		}
		fs.EachError(func(t string, p int32, err error) {
			r.noteError(fmt.Errorf("table %s: fetch %s[%d]: %w", ts.Name, t, p, err))
		})
		recs := fs.Records()
		for _, rec := range recs {
			next[rec.Partition] = rec.Offset + 1
		}
		if err := tt.table.apply(recs, skipped); err != nil {
			cl.Close()
			return nil, fmt.Errorf("route %q table %s: %w", r.name, ts.Name, err)
		}
	}
	fctx, cancel := context.WithCancel(context.Background())
	tt.cancel = cancel
	go r.survive("table", func() {
		defer close(tt.done)
		for {
			fs := cl.PollFetches(fctx)
			if fctx.Err() != nil || fs.IsClientClosed() {
				return
			}
			fs.EachError(func(t string, p int32, err error) {
				if !errors.Is(err, context.Canceled) {
					r.noteError(fmt.Errorf("table %s: fetch %s[%d]: %w", ts.Name, t, p, err))
				}
			})
			if err := tt.table.apply(fs.Records(), skipped); err != nil {
				// The state store failed (state.ErrBroken): the route's
				// next checkpoint stops it.
				r.noteError(fmt.Errorf("table %s: %w", ts.Name, err))
			}
		}
	})
	return tt, nil
}

func (t *topicTable) close() {
	if t.cancel != nil {
		t.cancel()
	}
	t.cl.Close()
	if t.cancel != nil {
		<-t.done
	}
}
