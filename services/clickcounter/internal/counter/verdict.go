package counter

import (
	"context"
	"fmt"
	"time"

	"github.com/snipdev/snip/pkg/events"
)

// Expired is ApplyVerdict's status for a verdict about a click older than
// CLICKS retention: it is acknowledged and changes nothing (see
// labelHorizon).
const Expired CorrectionStatus = -1

// labelHorizon is how long after the end of a click's label day a verdict
// about it is still applied: CLICKS retention plus a day. Labels are kept a
// day longer still (labelKeep), so a verdict redelivered or replayed before
// the horizon always finds its label and is not applied twice, and one
// arriving after it is refused rather than applied without that check.
func (c *Counter) labelHorizon(d Day) time.Time { return d.End().Add(c.maxAge + 24*time.Hour) }

func (c *Counter) labelKeep(d Day) time.Time { return d.End().Add(c.maxAge + 48*time.Hour) }

// ApplyVerdict applies a fraud verdict as a correction. fraudSeq is the
// verdict's FRAUD stream sequence, which orders verdicts about one click.
//
// The click's label is recorded, and wherever the click was already counted
// it moves between the human and bot counts (total, day, hour, country,
// referrer) once; a verdict that repeats the current label changes nothing,
// and one older than a label already applied is stale. A verdict that comes
// before its click is counted needs no waiting: the click is counted with
// the recorded label when it comes.
func (c *Counter) ApplyVerdict(ctx context.Context, v *events.FraudVerdict, fraudSeq uint64) (CorrectionStatus, error) {
	p := events.Partition(v.Code, c.n)
	if v.Partition != p {
		c.log.Warn("verdict names another partition than its link code hashes to; using the code's",
			"verdict", v.ID, "code", v.Code, "partition", v.Partition, "computed", p)
	}
	mark, err := ParseID(v.ClickID)
	if err != nil {
		return 0, fmt.Errorf("apply verdict %s: %w: %w", v.ID, err, events.ErrMalformed)
	}
	day := mark.LabelDay()
	if c.now().After(c.labelHorizon(day)) {
		c.m.corrections.WithLabelValues("expired").Inc()
		return Expired, nil
	}
	t := v.ClickTime.UTC()
	corr := &Correction{
		Partition:   p,
		ClickID:     v.ClickID,
		LabelDay:    day,
		FraudSeq:    fraudSeq,
		To:          LabelOf(v.Bot),
		Source:      LabelOf(v.SourceBot),
		ClickSeq:    v.ClickSeq,
		Link:        LinkRef{Owner: v.Owner, Code: v.Code},
		Day:         DayOf(t),
		Hour:        t.Hour(),
		Country:     CountryOf(v.Country),
		Referrer:    ReferrerHost(v.Referrer),
		LabelExpiry: c.labelKeep(day),
	}
	for range maxWriteAttempts {
		st, err := c.store.State(ctx, p)
		if err != nil {
			return 0, fmt.Errorf("apply verdict %s: %w", v.ID, err)
		}
		corr.Expect = st
		res, err := c.store.Correct(ctx, corr)
		if err != nil {
			return 0, fmt.Errorf("apply verdict %s: %w", v.ID, err)
		}
		switch res.Status {
		case CorrectionConflict:
			continue
		case Relabelled:
			c.m.corrections.WithLabelValues("relabelled").Inc()
		case Unchanged:
			c.m.corrections.WithLabelValues("unchanged").Inc()
		case Stale:
			c.m.corrections.WithLabelValues("stale").Inc()
		}
		return res.Status, nil
	}
	return 0, fmt.Errorf("apply verdict %s: %w", v.ID, ErrContention)
}

// ApplyLinkEvent records a LINKS event (seq is its stream sequence): who
// owns a code, or that it was deleted. The stats API needs it for links
// with no clicks yet, and to refuse deleted ones.
func (c *Counter) ApplyLinkEvent(ctx context.Context, e *events.LinkEvent, seq uint64) error {
	applied, err := c.store.ApplyLinkEvent(ctx, e, seq)
	if err != nil {
		return fmt.Errorf("apply link event %s: %w", e.ID, err)
	}
	if applied {
		c.m.linkEvents.WithLabelValues("applied").Inc()
	} else {
		c.m.linkEvents.WithLabelValues("stale").Inc()
	}
	return nil
}
