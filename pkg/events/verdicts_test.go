package events_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
)

func verdictLabels(n int, referrer string) []events.FraudVerdictLabel {
	out := make([]events.FraudVerdictLabel, n)
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := range out {
		out[i] = events.FraudVerdictLabel{
			ClickID: events.NewID(), ClickSeq: uint64(1000 + i), Code: "abc123", Owner: "acme",
			Rule: "link_flood", AlertID: "link_flood:abc123:-:1764504000", Bot: true,
			ClickTime: at, Country: "DE", Referrer: referrer, Time: at.Add(time.Second),
		}
	}
	return out
}

func TestSplitVerdictsByCount(t *testing.T) {
	t.Parallel()
	labels := verdictLabels(2*events.MaxVerdictLabels+1, "")
	msgs := events.SplitVerdicts(3, 1201, 2700, labels)
	var ids []string
	var sizes []int
	for _, m := range msgs {
		ids = append(ids, m.ID)
		sizes = append(sizes, len(m.Labels))
		if m.Parts != 3 || m.Partition != 3 || m.FirstSeq != 1201 || m.LastSeq != 2700 {
			t.Errorf("message %s: partition %d, seqs %d-%d, parts %d", m.ID, m.Partition, m.FirstSeq, m.LastSeq, m.Parts)
		}
		if err := m.Validate(); err != nil {
			t.Errorf("message %s: %v", m.ID, err)
		}
	}
	if diff := cmp.Diff([]string{"v:3:1201-2700:0", "v:3:1201-2700:1", "v:3:1201-2700:2"}, ids); diff != "" {
		t.Errorf("ids (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{events.MaxVerdictLabels, events.MaxVerdictLabels, 1}, sizes); diff != "" {
		t.Errorf("labels per message (-want +got):\n%s", diff)
	}
	// The same labels give the same messages: a retry re-sends the same IDs.
	if diff := cmp.Diff(msgs, events.SplitVerdicts(3, 1201, 2700, labels)); diff != "" {
		t.Errorf("second split differs (-first +second):\n%s", diff)
	}
	if got := events.SplitVerdicts(3, 1, 2, nil); got != nil {
		t.Errorf("no labels: %d messages, want none", len(got))
	}
}

func TestSplitVerdictsByBytes(t *testing.T) {
	t.Parallel()
	// Referrers of '<' are escaped to 6 bytes each: the worst case the
	// bound assumes.
	labels := verdictLabels(events.MaxVerdictLabels, strings.Repeat("<", 2000))
	msgs := events.SplitVerdicts(0, 1, 500, labels)
	if len(msgs) < 2 {
		t.Fatalf("%d messages for %d labels with 12 KB referrers, want several", len(msgs), len(labels))
	}
	total := 0
	for _, m := range msgs {
		data, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > events.MaxVerdictBatchBytes {
			t.Errorf("message %s: %d bytes, over %d", m.ID, len(data), events.MaxVerdictBatchBytes)
		}
		got, err := events.DecodeFraudVerdictBatch(data)
		if err != nil {
			t.Fatalf("decode %s: %v", m.ID, err)
		}
		if diff := cmp.Diff(m, got); diff != "" {
			t.Errorf("round trip %s (-sent +decoded):\n%s", m.ID, diff)
		}
		total += len(m.Labels)
	}
	if total != len(labels) {
		t.Errorf("%d labels in the messages, want %d", total, len(labels))
	}
}

func TestDecodeFraudVerdictBatchRefuses(t *testing.T) {
	t.Parallel()
	good := func() events.FraudVerdictBatch {
		return events.SplitVerdicts(1, 10, 20, verdictLabels(3, "https://t.co/x"))[0]
	}
	for name, tc := range map[string]struct {
		edit func(*events.FraudVerdictBatch)
		want error
	}{
		"unknown version":    {func(b *events.FraudVerdictBatch) { b.V = 2 }, events.ErrUnknownVersion},
		"bad id":             {func(b *events.FraudVerdictBatch) { b.ID = "v 1" }, events.ErrMalformed},
		"no labels":          {func(b *events.FraudVerdictBatch) { b.Labels = nil }, events.ErrMalformed},
		"too many labels":    {func(b *events.FraudVerdictBatch) { b.Labels = verdictLabels(events.MaxVerdictLabels+1, "") }, events.ErrMalformed},
		"click twice":        {func(b *events.FraudVerdictBatch) { b.Labels[2].ClickID = b.Labels[0].ClickID }, events.ErrMalformed},
		"bad click id":       {func(b *events.FraudVerdictBatch) { b.Labels[1].ClickID = "x" }, events.ErrMalformed},
		"no rule":            {func(b *events.FraudVerdictBatch) { b.Labels[1].Rule = "" }, events.ErrMalformed},
		"part beyond parts":  {func(b *events.FraudVerdictBatch) { b.Part = 1 }, events.ErrMalformed},
		"seqs backwards":     {func(b *events.FraudVerdictBatch) { b.FirstSeq = 30 }, events.ErrMalformed},
		"negative partition": {func(b *events.FraudVerdictBatch) { b.Partition = -1 }, events.ErrMalformed},
		"no click seq":       {func(b *events.FraudVerdictBatch) { b.Labels[1].ClickSeq = 0 }, events.ErrMalformed},
		"no click time":      {func(b *events.FraudVerdictBatch) { b.Labels[2].ClickTime = time.Time{} }, events.ErrMalformed},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := good()
			tc.edit(&b)
			data, err := json.Marshal(b)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := events.DecodeFraudVerdictBatch(data); !errors.Is(err, tc.want) {
				t.Errorf("decode: %v, want %v", err, tc.want)
			}
		})
	}
	big := make([]byte, events.MaxVerdictBatchBytes+1)
	if _, err := events.DecodeFraudVerdictBatch(big); !errors.Is(err, events.ErrMalformed) {
		t.Errorf("decode of %d bytes: %v, want ErrMalformed", len(big), err)
	}
}

// A single verdict of an older detector reads as a message of one label.
func TestDecodeFraudVerdictBatchReadsASingleVerdict(t *testing.T) {
	t.Parallel()
	l := verdictLabels(1, "https://t.co/x")[0]
	v := events.FraudVerdict{V: events.FraudVersion, ID: l.ClickID + ":bot", Partition: 5,
		FraudVerdictLabel: events.FraudVerdictLabel{ClickID: l.ClickID, ClickSeq: l.ClickSeq, Code: l.Code, Owner: l.Owner, Rule: l.Rule, AlertID: l.AlertID, Bot: true, ClickTime: l.ClickTime, Country: l.Country, Referrer: l.Referrer, Time: l.Time}}
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	b, err := events.DecodeFraudVerdictBatch(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]events.FraudVerdict{v}, b.Verdicts()); diff != "" {
		t.Errorf("expanded (-want +got):\n%s", diff)
	}
}

func TestFraudVerdictBatchVerdicts(t *testing.T) {
	t.Parallel()
	b := events.SplitVerdicts(6, 7, 9, verdictLabels(2, ""))[0]
	vs := b.Verdicts()
	if len(vs) != 2 {
		t.Fatalf("%d verdicts, want 2", len(vs))
	}
	for i, v := range vs {
		if v.ID != b.ID || v.Partition != 6 || v.ClickID != b.Labels[i].ClickID || v.ClickSeq != b.Labels[i].ClickSeq || !v.Bot {
			t.Errorf("verdict %d: %+v", i, v)
		}
	}
}
