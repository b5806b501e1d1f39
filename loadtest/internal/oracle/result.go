package oracle

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
	"github.com/snipdev/snip/pkg/events"
)

// Status is a check's verdict.
type Status string

// Statuses.
const (
	Pass    Status = "PASS"
	Fail    Status = "FAIL"
	Skipped Status = "SKIPPED"
)

// Result is one row of the oracle's table.
type Result struct {
	Sink     string `json:"sink"`
	Expected uint64 `json:"expected"`
	Got      uint64 `json:"got"`
	Missing  uint64 `json:"missing"`
	Extra    uint64 `json:"extra"`
	// Dup counts clicks seen twice: a second stored copy, a second event
	// for one request, a repeated verdict.
	Dup    uint64 `json:"dup"`
	Status Status `json:"status"`
	Note   string `json:"note,omitempty"`
}

func (r *Result) judge() {
	if r.Missing == 0 && r.Extra == 0 && r.Dup == 0 {
		r.Status = Pass
	} else {
		r.Status = Fail
	}
}

// Sink names, as they appear in the table.
const (
	SinkLog          = "clicks log (CLICKS)"
	SinkSourceLabels = "bot labels at source"
	SinkFraud        = "fraud verdicts (bursts)"
	SinkFraudAlerts  = "fraud alerts (bursts)"
	SinkCounter      = "counter totals"
	SinkCounterBots  = "counter bot split"
	// SinkCounterCountries and SinkCounterReferrers are the counter's
	// counts by country and by referrer host.
	SinkCounterCountries = "counter countries"
	SinkCounterReferrers = "counter referrers"
	// SinkCounterHours and SinkCounterDays are the counter's hourly and
	// daily series, SinkCounterUniques its daily unique visitors.
	SinkCounterHours   = "counter hourly"
	SinkCounterDays    = "counter daily"
	SinkCounterUniques = "counter uniques"
	SinkWarehouse      = "warehouse event IDs"
	SinkWarehouseBot   = "warehouse bot flags"
	SinkReaders        = "readers caught up"
)

// logResult compares the log with the truth.
func (s *state) logResult() Result {
	r := Result{Sink: SinkLog, Expected: s.tr.SentCount(), Got: s.present, Dup: s.dups}
	r.Missing = s.tr.SentCount() - s.sentFound
	var uncertainIn uint64
	s.forPresent(func(seq uint64, _ *slot) {
		switch s.tr.Outcome(seq) {
		case truth.Uncertain:
			uncertainIn++
		case truth.Refused, truth.NotSent:
			r.Extra++
		}
	})
	r.Extra += s.foreign + s.wrongLink
	var notes []string
	if n := len(s.tr.Uncertain); n > 0 {
		notes = append(notes, fmt.Sprintf("%d of %d unanswered or unconfirmed requests recorded (allowed)", uncertainIn, n))
	}
	if s.foreign > 0 {
		notes = append(notes, fmt.Sprintf("%d clicks on the run's links name no click of the run", s.foreign))
	}
	if s.invalid > 0 {
		notes = append(notes, fmt.Sprintf("%d clicks fail events.DecodeClick (readers park them)", s.invalid))
		r.Extra += s.invalid
	}
	if s.wrongLink > 0 {
		notes = append(notes, fmt.Sprintf("%d clicks recorded against the wrong link", s.wrongLink))
	}
	if s.wrongPartition > 0 {
		notes = append(notes, fmt.Sprintf("%d clicks stored in another partition than their link's of %d (a routing defect: readers park them as %s)",
			s.wrongPartition, s.partitions, events.ReasonWrongPartition))
		r.Extra += s.wrongPartition
	}
	r.Note = strings.Join(notes, "; ")
	r.judge()
	return r
}

// sourceLabelResult checks Click.Bot against the user agents sent: known
// bots labelled, people (and bursts, which look like people) not.
func (s *state) sourceLabelResult() Result {
	r := Result{Sink: SinkSourceLabels}
	s.forPresent(func(seq uint64, sl *slot) {
		want := s.gen.Visit(seq).Kind == workload.Bot
		switch {
		case want && sl.bot:
			r.Expected++
			r.Got++
		case want:
			r.Expected++
			r.Missing++
		case sl.bot:
			r.Got++
			r.Extra++
		}
	})
	r.Note = "bots: known bot user agents; extra: browsers labelled bot"
	if s.tr.ForwardedFor && s.present > 0 {
		if s.xffHonoured == 0 {
			r.Note += "; X-Forwarded-For was ignored: every click has the generator's address (set SNIP_TRUSTED_PROXIES on the redirect)"
		} else {
			r.Note += fmt.Sprintf("; visitor address from X-Forwarded-For in %d of %d clicks", s.xffHonoured, s.present)
		}
	}
	r.judge()
	return r
}

// fraudResult checks that every click the log holds of a burst the rule
// can find (findable) is labelled bot.
func (s *state) fraudResult() Result {
	unknown := uint64(len(s.unresolved))
	r := Result{Sink: SinkFraud, Dup: s.verdictDups, Extra: unknown + s.verdictWrongLink}
	bursts := map[int64]bool{}
	s.forPresent(func(seq uint64, _ *slot) {
		v := s.gen.Visit(seq)
		if v.Kind != workload.Burst || !s.findable(v.Burst) {
			return
		}
		r.Expected++
		bursts[v.Burst] = true
		if s.finalBot(seq) {
			r.Got++
		} else {
			r.Missing++
		}
	})
	notes := []string{fmt.Sprintf("%d bursts", len(bursts))}
	if n := s.cutBursts(); n > 0 {
		notes = append(notes, fmt.Sprintf("%d bursts not judged: the log holds %d or fewer of their clicks (requests refused or unanswered), which the rule does not call a burst", n, s.burstThreshold))
	}
	if unknown > 0 {
		notes = append(notes, fmt.Sprintf("%d verdicts name clicks not in the log", unknown))
	}
	if s.verdictWrongLink > 0 {
		notes = append(notes, fmt.Sprintf("%d verdicts name another link than their click's", s.verdictWrongLink))
	}
	if len(s.verdictRules) > 0 {
		rules := make([]string, 0, len(s.verdictRules))
		var total uint64
		for rule, n := range s.verdictRules {
			rules = append(rules, fmt.Sprintf("%s %d", rule, n))
			total += n
		}
		sort.Strings(rules)
		notes = append(notes, fmt.Sprintf("also labelled bot: %d human-looking clicks (%s)", total, strings.Join(rules, ", ")))
	}
	r.Note = strings.Join(notes, "; ")
	r.judge()
	return r
}

// alertResult checks that every burst the rule can find (findable) is
// alerted: an alert of rule visitor_burst on the burst's link naming its
// visitor (one alert may cover several bursts of a visitor on a link, the
// rule alerts once an hour), and that no alert is stored twice.
func (s *state) alertResult() Result {
	r := Result{Sink: SinkFraudAlerts, Dup: s.alertDups}
	var missing []string
	for b, k := range s.bursts {
		if !s.findable(b) {
			continue
		}
		r.Expected++
		if _, ok := s.alerted[k]; ok {
			r.Got++
			continue
		}
		r.Missing++
		missing = append(missing, fmt.Sprintf("burst %d on %s", b, k.code))
	}
	sort.Strings(missing)
	notes := []string{fmt.Sprintf("%d alerts on the run's links", s.alerts)}
	if s.alertDups > 0 {
		notes = append(notes, fmt.Sprintf("%d alert IDs stored twice", s.alertDups))
	}
	if m := limitList("bursts without an alert", missing); m != "" {
		notes = append(notes, m)
	}
	r.Note = strings.Join(notes, "; ")
	r.judge()
	return r
}

// countDiff accumulates per-link count comparisons into a row.
func countDiff(r *Result, want, got uint64) bool {
	r.Expected += want
	r.Got += got
	switch {
	case got < want:
		r.Missing += want - got
	case got > want:
		r.Extra += got - want
	}
	return got == want
}

// skipped is a row for a sink that is not checked.
func skipped(sink, why string) Result {
	return Result{Sink: sink, Status: Skipped, Note: why}
}

// Passed reports whether no row failed.
func Passed(rows []Result) bool {
	for _, r := range rows {
		if r.Status == Fail {
			return false
		}
	}
	return len(rows) > 0
}

// WriteTable prints the rows as an aligned table.
func WriteTable(w io.Writer, rows []Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "sink\texpected\tgot\tmissing\textra\tdup\tverdict\tnote")
	for _, r := range rows {
		if r.Status == Skipped {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t%s\t%s\n", r.Sink, r.Status, r.Note)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", r.Sink, r.Expected, r.Got, r.Missing, r.Extra, r.Dup, r.Status, r.Note)
	}
	return tw.Flush()
}
