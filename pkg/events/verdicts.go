package events

import (
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/encoding/json"
)

// FraudVerdictBatchVersion is the schema version of FraudVerdictBatch.
const FraudVerdictBatchVersion = 1

// Bounds of one FraudVerdictBatch message. SplitVerdicts cuts a detector
// batch's labels into as many messages as these need; DecodeFraudVerdictBatch
// refuses a message beyond them.
const (
	// MaxVerdictLabels is the most labels one message carries. 500 is the
	// fraud detector's default batch of events, each labelled: one message
	// per batch in a flood where every click is labelled.
	MaxVerdictLabels = 500
	// MaxVerdictBatchBytes bounds one encoded message, well under NATS's
	// default max_payload of 1 MiB (FRAUD_VERDICTS refuses larger ones).
	MaxVerdictBatchBytes = 768 << 10
)

// FraudVerdictBatch labels many clicks in one message: the labels one
// detector batch of one CLICKS partition decided (or a part of them, when
// they exceed MaxVerdictLabels or MaxVerdictBatchBytes). It is published on
// FraudVerdictBatchSubject(Partition), stored in FRAUD_VERDICTS, with
// Nats-Msg-Id = ID.
//
// ID is deterministic: VerdictBatchID(Partition, FirstSeq, LastSeq, Part),
// from the CLICKS sequences of the events the detector judged to decide these
// labels, so a detector that retries the batch re-sends the same IDs and the
// stream's duplicate window drops the copies. Readers apply each label keyed
// by its click ID: a click labelled by two messages cut differently (a batch
// judged again by another member after a takeover) is still counted once.
type FraudVerdictBatch struct {
	V  int    `json:"v"`
	ID string `json:"id"`
	// Partition is the CLICKS partition of every click labelled.
	Partition int `json:"partition"`
	// FirstSeq and LastSeq are the CLICKS sequences of the first and last
	// event judged in the detector batch. A label may name a click before
	// FirstSeq: a rule that fires labels the earlier clicks of its window.
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// Part and Parts say which of the batch's messages this is (0-based).
	Part   int                 `json:"part"`
	Parts  int                 `json:"parts"`
	Labels []FraudVerdictLabel `json:"labels"`
}

// FraudVerdictLabel labels one click, keyed by the click's event ID: a
// FraudVerdict less what a message of many labels shares (its ID and the
// partition).
type FraudVerdictLabel struct {
	// ClickID is the event ID of the click judged.
	ClickID string `json:"click_id"`
	// ClickSeq is the click's CLICKS sequence.
	ClickSeq uint64 `json:"click_seq"`
	Code     string `json:"code"`
	Owner    string `json:"owner"`
	// Rule and AlertID say why.
	Rule    string `json:"rule"`
	AlertID string `json:"alert_id,omitempty"`
	// Bot is the verdict: true labels the click a bot, false a human.
	Bot bool `json:"bot"`
	// SourceBot is the click's own Bot label, set at the redirect.
	SourceBot bool `json:"source_bot"`
	// ClickTime, Country and Referrer are copied from the click so a counter
	// can correct its per-hour, per-country and per-referrer counts.
	ClickTime time.Time `json:"click_ts"`
	Country   string    `json:"country,omitempty"`
	Referrer  string    `json:"referrer,omitempty"`
	// Time is the event time of the decision.
	Time time.Time `json:"ts"`
}

// FraudVerdictBatchSubject is the subject of the verdict messages about the
// clicks of one CLICKS partition: fraud.verdicts.<partition>.
func FraudVerdictBatchSubject(partition int) string {
	return "fraud.verdicts." + strconv.Itoa(partition)
}

// VerdictBatchID is the deterministic ID of part of a detector batch's
// verdicts: "v:<partition>:<firstSeq>-<lastSeq>:<part>", e.g. "v:3:1201-1700:0".
// At most 2+4+1+20+1+20+1+3 = 52 characters.
func VerdictBatchID(partition int, firstSeq, lastSeq uint64, part int) string {
	b := make([]byte, 0, 52)
	b = append(b, "v:"...)
	b = strconv.AppendInt(b, int64(partition), 10)
	b = append(b, ':')
	b = strconv.AppendUint(b, firstSeq, 10)
	b = append(b, '-')
	b = strconv.AppendUint(b, lastSeq, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(part), 10)
	return string(b)
}

// SplitVerdicts cuts the labels one detector batch of partition decided (the
// batch judged the events FirstSeq..LastSeq) into messages of at most
// MaxVerdictLabels labels and MaxVerdictBatchBytes each, in order, each with
// its deterministic ID. The same labels always give the same messages. It
// returns none for no labels.
func SplitVerdicts(partition int, firstSeq, lastSeq uint64, labels []FraudVerdictLabel) []FraudVerdictBatch {
	if len(labels) == 0 {
		return nil
	}
	var cuts [][]FraudVerdictLabel
	start, size := 0, batchOverhead
	for i := range labels {
		n := labelBound(&labels[i])
		if i > start && (i-start == MaxVerdictLabels || size+n > MaxVerdictBatchBytes) {
			cuts = append(cuts, labels[start:i])
			start, size = i, batchOverhead
		}
		size += n
	}
	cuts = append(cuts, labels[start:])
	out := make([]FraudVerdictBatch, len(cuts))
	for k, ls := range cuts {
		out[k] = FraudVerdictBatch{
			V: FraudVerdictBatchVersion, ID: VerdictBatchID(partition, firstSeq, lastSeq, k),
			Partition: partition, FirstSeq: firstSeq, LastSeq: lastSeq,
			Part: k, Parts: len(cuts), Labels: ls,
		}
	}
	return out
}

// batchOverhead bounds a message's encoding without its labels.
const batchOverhead = 256

// labelBound is an upper bound of one label's encoding: its fixed fields and
// punctuation, and each string at its worst escaping (6 bytes a byte, \u00XX).
func labelBound(l *FraudVerdictLabel) int {
	return 256 + 6*(len(l.ClickID)+len(l.Code)+len(l.Owner)+len(l.Rule)+len(l.AlertID)+len(l.Country)+len(l.Referrer))
}

// Verdicts expands the message into one FraudVerdict per label, each with
// the message's ID and partition.
func (b *FraudVerdictBatch) Verdicts() []FraudVerdict {
	out := make([]FraudVerdict, len(b.Labels))
	for i, l := range b.Labels {
		out[i] = FraudVerdict{V: FraudVersion, ID: b.ID, Partition: b.Partition, FraudVerdictLabel: l}
	}
	return out
}

// Validate checks what every reader relies on: a valid ID, 1 to
// MaxVerdictLabels labels, each with a click ID (at most once per message),
// a rule, a code and an owner, and a part within the parts.
func (b *FraudVerdictBatch) Validate() error {
	switch {
	case b.V != FraudVerdictBatchVersion:
		return fmt.Errorf("fraud verdicts version %d: %w", b.V, ErrUnknownVersion)
	case !validFraudID(b.ID):
		return fmt.Errorf("fraud verdicts: id %q: %w", b.ID, ErrMalformed)
	case b.Partition < 0 || b.FirstSeq > b.LastSeq || b.Parts < 1 || b.Part < 0 || b.Part >= b.Parts:
		return fmt.Errorf("fraud verdicts %s: partition %d, seqs %d-%d, part %d of %d: %w",
			b.ID, b.Partition, b.FirstSeq, b.LastSeq, b.Part, b.Parts, ErrMalformed)
	case len(b.Labels) == 0 || len(b.Labels) > MaxVerdictLabels:
		return fmt.Errorf("fraud verdicts %s: %d labels, want 1..%d: %w", b.ID, len(b.Labels), MaxVerdictLabels, ErrMalformed)
	}
	seen := make(map[string]struct{}, len(b.Labels))
	for i := range b.Labels {
		l := &b.Labels[i]
		switch {
		case !validID(l.ClickID):
			return fmt.Errorf("fraud verdicts %s: label %d: click id %q: %w", b.ID, i, l.ClickID, ErrMalformed)
		case l.Rule == "" || !ValidToken(l.Code) || !ValidToken(l.Owner):
			return fmt.Errorf("fraud verdicts %s: label %d: rule %q code %q owner %q: %w", b.ID, i, l.Rule, l.Code, l.Owner, ErrMalformed)
		case l.ClickSeq == 0 || l.ClickTime.IsZero():
			// The counter decides by them whether it counted the click and
			// which day and hour it moves: without them a verdict could
			// move a click never counted.
			return fmt.Errorf("fraud verdicts %s: label %d: click seq %d, click time %s: %w", b.ID, i, l.ClickSeq, l.ClickTime, ErrMalformed)
		}
		if _, dup := seen[l.ClickID]; dup {
			return fmt.Errorf("fraud verdicts %s: click %s labelled twice: %w", b.ID, l.ClickID, ErrMalformed)
		}
		seen[l.ClickID] = struct{}{}
	}
	return nil
}

// DecodeFraudVerdictBatch parses and validates a verdict message of
// FRAUD_VERDICTS. A single FraudVerdict (what detectors published before
// verdicts came in bulk, on fraud.verdicts.<owner>.<code>) is read as a
// message of one label, so a reader keeps up while detectors are upgraded.
func DecodeFraudVerdictBatch(data []byte) (FraudVerdictBatch, error) {
	if len(data) > MaxVerdictBatchBytes {
		return FraudVerdictBatch{}, fmt.Errorf("decode fraud verdicts: %d bytes, at most %d: %w", len(data), MaxVerdictBatchBytes, ErrMalformed)
	}
	var head struct {
		V       *int            `json:"v"`
		ClickID string          `json:"click_id"`
		Labels  json.RawMessage `json:"labels"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return FraudVerdictBatch{}, fmt.Errorf("decode fraud verdicts: %w: %v", ErrMalformed, err)
	}
	if head.Labels == nil && head.ClickID != "" {
		v, err := DecodeFraudVerdict(data)
		if err != nil {
			return FraudVerdictBatch{}, err
		}
		return FraudVerdictBatch{
			V: FraudVerdictBatchVersion, ID: v.ID, Partition: v.Partition, FirstSeq: v.ClickSeq, LastSeq: v.ClickSeq,
			Parts: 1, Labels: []FraudVerdictLabel{v.FraudVerdictLabel},
		}, nil
	}
	var b FraudVerdictBatch
	if err := decodeVersioned(data, FraudVerdictBatchVersion, &b); err != nil {
		return FraudVerdictBatch{}, fmt.Errorf("decode fraud verdicts: %w", err)
	}
	if err := b.Validate(); err != nil {
		return FraudVerdictBatch{}, fmt.Errorf("decode fraud verdicts: %w", err)
	}
	return b, nil
}
