package jsfeed

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// Clicks answers the counter's questions about the CLICKS stream.
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
