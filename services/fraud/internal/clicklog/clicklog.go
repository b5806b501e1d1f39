// Package clicklog reads CLICKS outside the consumer group: one event by
// sequence (to label a click a rule judged after the fact) and a partition's
// recent past (to rebuild a partition's windows on takeover). It is the
// JetStream side of fraud.ClickLog.
package clicklog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

var _ fraud.ClickLog = (*Log)(nil)

// Log reads CLICKS.
type Log struct {
	js jetstream.JetStream
	// partitions is CLICKS' partition count, for the rule of validity.
	partitions int
	// fetch is how many events a rebuild asks for at a time.
	fetch int

	// mu guards clicks: the handle of CLICKS, looked up once (each lookup
	// is a stream info request; one per read-back was 10% of fraud
	// detection's CPU while it labelled a flood's earlier clicks) and again
	// after a read fails.
	mu     sync.Mutex
	clicks jetstream.Stream
}

// stream returns the handle of CLICKS.
func (l *Log) stream(ctx context.Context) (jetstream.Stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clicks != nil {
		return l.clicks, nil
	}
	s, err := l.js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", events.ClicksStream, err)
	}
	l.clicks = s
	return s, nil
}

// forget drops the handle after a failed read, so the next one looks the
// stream up again.
func (l *Log) forget() {
	l.mu.Lock()
	l.clicks = nil
	l.mu.Unlock()
}

// New returns a Log on js, whose CLICKS stream has the given number of
// partitions. It applies the rule of validity every reader applies
// (events.ReadClick): an event the group's runtime parked is never fed to a
// rebuild nor labelled.
func New(js jetstream.JetStream, partitions int) *Log {
	return &Log{js: js, partitions: partitions, fetch: 1000}
}

// maxNoResponders is how many pulls in a row Scan retries when no server
// answers them.
const maxNoResponders = 20

// consumerInfo is cons.Info, retried while no server answers (see Scan).
func consumerInfo(ctx context.Context, cons jetstream.Consumer) (*jetstream.ConsumerInfo, error) {
	for i := 0; ; i++ {
		info, err := cons.Info(ctx)
		if !errors.Is(err, nats.ErrNoResponders) || i == maxNoResponders {
			return info, err
		}
	}
}

func (l *Log) get(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	s, err := l.stream(ctx)
	if err != nil {
		return nil, err
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("get %s sequence %d: %w", events.ClicksStream, seq, fraud.ErrNotInLog)
	}
	if err != nil {
		l.forget()
		return nil, fmt.Errorf("get %s sequence %d: %w", events.ClicksStream, seq, err)
	}
	return m, nil
}

// Click returns the event stored at seq.
func (l *Log) Click(ctx context.Context, seq uint64) (reader.Event, error) {
	m, err := l.get(ctx, seq)
	if err != nil {
		return reader.Event{}, err
	}
	c, err := events.ReadClick(m.Data, m.Subject, l.partitions, m.Time)
	if err != nil {
		return reader.Event{}, fmt.Errorf("%s sequence %d: %w", events.ClicksStream, seq, err)
	}
	return reader.Event{Click: c, Partition: events.PartitionOf(m.Subject), Seq: m.Sequence, Stored: m.Time}, nil
}

// StoredAt returns when the event at seq was stored.
func (l *Log) StoredAt(ctx context.Context, seq uint64) (time.Time, error) {
	m, err := l.get(ctx, seq)
	if err != nil {
		return time.Time{}, err
	}
	return m.Time, nil
}

// Next returns the sequence of partition's first event stored at or after
// from, or 0 when CLICKS holds none: one lookup of the next message on the
// partition's subjects. Events that fail the rule of validity count too
// (only a lookup of each would tell): it says where the partition's events
// begin, for a replay, which parks those again.
func (l *Log) Next(ctx context.Context, partition int, from uint64) (uint64, error) {
	s, err := l.stream(ctx)
	if err != nil {
		return 0, err
	}
	m, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(events.PartitionFilter(partition)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		l.forget()
		return 0, fmt.Errorf("partition %d's next event from %d: %w", partition, from, err)
	}
	return m.Sequence, nil
}

// Scan reads partition's events stored at or after from, up to but not
// including sequence until, with an ordered consumer (ephemeral, flow
// controlled, no acks: the cheapest way to read a stretch of a stream),
// deleted when done.
// Events that fail the rule of validity are skipped: the group's runtime
// parked them.
//
// It knows where to stop before it starts (the partition's last event, or
// the one before until), so a slow or empty fetch is waited out, not taken
// for the end (only the consumer saying nothing is pending is): a rebuild
// that stopped early would judge the next events against a state with a
// hole in it.
func (l *Log) Scan(ctx context.Context, partition int, from time.Time, until uint64, fn func(reader.Event)) (int, error) {
	s, err := l.js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return 0, fmt.Errorf("scan partition %d: %w", partition, err)
	}
	last, err := s.GetLastMsgForSubject(ctx, events.PartitionFilter(partition))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil // the partition is empty
	}
	if err != nil {
		return 0, fmt.Errorf("scan partition %d: last event: %w", partition, err)
	}
	end := min(last.Sequence, until-1) // the last sequence that may be fed
	// Each scan (every rebuild of a partition's state: each assignment,
	// each rewind) creates a consumer on CLICKS: deleted when done, so
	// that rebuilds leave none behind.
	cons, done, err := reader.OneOffRead(ctx, l.js, events.ClicksStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.PartitionFilter(partition)},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &from,
	})
	if err != nil {
		return 0, fmt.Errorf("scan partition %d: %w", partition, err)
	}
	defer done()
	if info, err := consumerInfo(ctx, cons); err != nil {
		return 0, fmt.Errorf("scan partition %d: %w", partition, err)
	} else if info.NumPending == 0 {
		return 0, nil // nothing stored at or after from
	}
	n, noResponders := 0, 0
	for {
		batch, err := cons.Fetch(l.fetch, jetstream.FetchMaxWait(5*time.Second))
		if errors.Is(err, nats.ErrNoResponders) && noResponders < maxNoResponders {
			// On a cluster a pull can reach no one while the ordered
			// consumer is being (re)created on another node; the same
			// consumer's next pull goes on where it stopped.
			noResponders++
			continue
		}
		if err != nil {
			return n, fmt.Errorf("scan partition %d: %w", partition, err)
		}
		noResponders = 0
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				return n, fmt.Errorf("scan partition %d: %w", partition, err)
			}
			seq := meta.Sequence.Stream
			if seq > end {
				return n, nil
			}
			if c, err := events.ReadClick(m.Data(), m.Subject(), l.partitions, meta.Timestamp); err == nil {
				fn(reader.Event{Click: c, Partition: partition, Seq: seq, Stored: meta.Timestamp, Deliveries: 1})
				n++
			}
			if seq == end || meta.NumPending == 0 {
				return n, nil
			}
		}
		if err := batch.Error(); errors.Is(err, nats.ErrNoResponders) && noResponders < maxNoResponders {
			noResponders++
			continue
		} else if err != nil && !errors.Is(err, nats.ErrTimeout) {
			return n, fmt.Errorf("scan partition %d: %w", partition, err)
		}
		if err := ctx.Err(); err != nil {
			return n, fmt.Errorf("scan partition %d: %w", partition, err)
		}
		if got == 0 {
			// Nothing came: slow, or nothing left from where the consumer
			// is (a start after the last event, or retention took them).
			info, err := consumerInfo(ctx, cons)
			if err != nil {
				return n, fmt.Errorf("scan partition %d: %w", partition, err)
			}
			if info.NumPending == 0 {
				return n, nil
			}
		}
	}
}
