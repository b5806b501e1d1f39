package jsfeed

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// Clicks answers the counter's questions about the CLICKS stream. Its reads
// go to the stream's leader (CLICKS does not allow direct gets), so they see
// every event the stream has acknowledged.
type Clicks struct {
	JS jetstream.JetStream
}

// FirstSeq returns the sequence of the oldest event CLICKS retains in
// partition p, or 0 when it holds none.
func (c Clicks) FirstSeq(ctx context.Context, p int) (uint64, error) { return c.NextSeq(ctx, p, 1) }

// NextSeq returns the sequence of partition p's first event stored at or
// after from, or 0 when there is none: one lookup of the next message on
// the partition's subjects.
func (c Clicks) NextSeq(ctx context.Context, p int, from uint64) (uint64, error) {
	s, err := c.JS.Stream(ctx, events.ClicksStream)
	if err != nil {
		return 0, fmt.Errorf("partition %d's next event from %d: %w", p, from, err)
	}
	msg, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(events.PartitionFilter(p)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("partition %d's next event from %d: %w", p, from, err)
	}
	return msg.Sequence, nil
}
