package jsfeed

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// Clicks answers the counter's questions about the CLICKS stream. Its reads
// go to the stream's leader (CLICKS does not allow direct gets), so they see
// every event the stream has acknowledged.
type Clicks struct {
	JS jetstream.JetStream
}

// FirstSeq returns the sequence of the oldest event CLICKS retains in
// partition p, or 0 when it holds none.
func (c Clicks) FirstSeq(ctx context.Context, p int) (uint64, error) {
	s, err := c.JS.Stream(ctx, events.ClicksStream)
	if err != nil {
		return 0, fmt.Errorf("first sequence of partition %d: %w", p, err)
	}
	msg, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(events.PartitionFilter(p)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("first sequence of partition %d: %w", p, err)
	}
	return msg.Sequence, nil
}

// Stored returns partition p's events stored at sequences from through
// before-1, at most max of them, one lookup each (the next message on the
// partition's subjects at or after a sequence). The counter calls it only
// when the store's watermark is behind the batch it was handed, which is
// rare and short.
func (c Clicks) Stored(ctx context.Context, p int, from, before uint64, max int) ([]counter.StoredClick, error) {
	s, err := c.JS.Stream(ctx, events.ClicksStream)
	if err != nil {
		return nil, fmt.Errorf("read partition %d: %w", p, err)
	}
	var out []counter.StoredClick
	for seq := from; seq < before && len(out) < max; {
		msg, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(events.PartitionFilter(p)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read partition %d at sequence %d: %w", p, seq, err)
		}
		if msg.Sequence >= before {
			break
		}
		out = append(out, counter.StoredClick{Seq: msg.Sequence, Subject: msg.Subject, Data: msg.Data, Stored: msg.Time})
		seq = msg.Sequence + 1
	}
	return out, nil
}
