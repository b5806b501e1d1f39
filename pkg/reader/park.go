// Parking: an event that can never be processed goes to DEAD_LETTER
// through package deadletter.

package reader

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
)

// park copies an event to DEAD_LETTER as dead.<group>.<reason> (package
// deadletter: the original payload with Snip-Dead-* headers saying where it
// came from, why, and after how many deliveries). Parking the same event
// again (after a crash, a replay of its batch, a lost ack) is deduplicated by
// its Nats-Msg-Id within DEAD_LETTER's duplicate window, and counted in
// snip_reader_parked_total once. It retries until the copy is stored or the
// partition is taken away.
func (w *worker) park(msg jetstream.Msg, md *jetstream.MsgMetadata, reason string, cause error) error {
	m := w.m
	parcel := deadletter.Parcel{
		Source:   m.cfg.Group,
		Reason:   sanitizeToken(reason),
		Stream:   events.ClicksStream,
		Subject:  msg.Subject(),
		Seq:      md.Sequence.Stream,
		Attempts: int(md.NumDelivered),
		Error:    cause.Error(),
		Consumer: m.cfg.Group,
		Data:     msg.Data(),
	}
	bo := m.cfg.newBackoff()
	for {
		ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
		ack, err := deadletter.Publish(ctx, m.js, parcel)
		cancel()
		if err == nil && ack.Duplicate {
			// Parked before (its batch was replayed, or its ack lost):
			// counted then.
			w.log.Info("event parked on DEAD_LETTER before; not counted again", "seq", parcel.Seq, "reason", parcel.Reason, "err", cause)
			return nil
		}
		if err == nil {
			m.met.parked.WithLabelValues(m.cfg.Group, parcel.Reason).Inc()
			w.log.Warn("event parked on DEAD_LETTER", "seq", parcel.Seq, "reason", parcel.Reason, "err", cause)
			return nil
		}
		w.log.Warn("park event: retrying", "seq", parcel.Seq, "err", err)
		if !w.sleep(bo.NextBackOff()) {
			return errReleased
		}
	}
}
