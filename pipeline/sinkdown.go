package pipeline

// Sink health: a failed write or broker connection marks the sink down
// (status, metric, one log line) until writes get through again.

import (
	"fmt"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func (r *route) sinkError(err error) {
	r.m.met.sinkErrors.WithLabelValues(r.name).Inc()
	r.st.Lock()
	first := !r.st.sinkDown
	r.st.sinkDown = true
	r.st.lastErr, r.st.lastErrAt = err.Error(), time.Now()
	r.st.Unlock()
	if first {
		r.log.Warn("sink unreachable; retrying, offsets hold", "err", err)
	}
}

func (r *route) sinkRecovered() {
	r.st.Lock()
	was := r.st.sinkDown
	r.st.sinkDown = false
	r.st.Unlock()
	if was {
		r.log.Info("sink reachable again")
	}
}

// connHook reports broker connection failures of the route's client, which
// would otherwise only surface after the delivery timeout.
type connHook struct{ r *route }

func (h *connHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil || h.r.ctx.Err() != nil {
		return
	}
	h.r.sinkError(fmt.Errorf("connect broker %d (%s:%d): %w", meta.NodeID, meta.Host, meta.Port, err))
}

func (h *connHook) OnBrokerWrite(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err == nil && key == 0 {
		// A produce request went out: the sink is reachable.
		h.r.st.Lock()
		down := h.r.st.sinkDown
		h.r.st.Unlock()
		if down {
			h.r.sinkRecovered()
		}
	}
}
