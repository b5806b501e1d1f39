package oracle

import (
	"fmt"
	"sort"
	"strings"

	"github.com/google/uuid"
)

// Sink names of the webhook rows.
const (
	// SinkWebhooks is the clicks the load test's webhook endpoint was
	// delivered, by event id.
	SinkWebhooks = "webhooks clicks"
	// SinkWebhookSignatures is the deliveries whose Standard Webhooks
	// signature verified.
	SinkWebhookSignatures = "webhooks signatures"
	// SinkWebhookOrder is each link's clicks in the order CLICKS stored
	// them.
	SinkWebhookOrder = "webhooks order per link"
)

// eventClick is the type of a click event in a webhook body.
const eventClick = "click"

// webhookRows checks what the endpoint was delivered against the log:
// every click on a link its filter wants at least once, nothing else,
// every request signed, and each link's clicks in CLICKS' order.
// Delivering an event again is the contract (at-least-once: receivers
// deduplicate by id), so copies are counted, not failed.
func (s *state) webhookRows(wr WebhookReader) []Result {
	d := wr.Deliveries()
	clicks := Result{Sink: SinkWebhooks}
	delivered := make(map[uint64]bool, len(d.Events))
	var unwanted, unknown, wrongLink, notClick uint64
	// first delivery order of each delivered click, by link
	type firstOf struct{ first, logSeq uint64 }
	byLink := map[string][]firstOf{}
	for _, e := range d.Events {
		clicks.Dup += e.Copies - 1
		if e.Type != eventClick {
			notClick++ // the endpoint asked for clicks only
			continue
		}
		id, err := uuid.Parse(e.ID)
		seq, ok := s.lookup(id)
		switch {
		case err != nil || !ok:
			if _, ours := s.linkOf(e.Code); ours {
				unknown++ // on the run's links, never sent
			} else {
				unwanted++ // another link than the filter's
			}
			continue
		case e.Code != s.tag.LinkCode(s.gen.Visit(seq).Link):
			wrongLink++
			continue
		case !wr.Wants(e.Code):
			unwanted++
			continue
		}
		clicks.Got++
		delivered[seq] = true
		byLink[e.Code] = append(byLink[e.Code], firstOf{e.First, s.logSeq[seq]})
	}
	s.forPresent(func(seq uint64, _ *slot) {
		if !wr.Wants(s.tag.LinkCode(s.gen.Visit(seq).Link)) {
			return
		}
		clicks.Expected++
		if !delivered[seq] {
			clicks.Missing++
		}
	})
	clicks.Extra = unwanted + unknown + wrongLink + notClick
	notes := []string{fmt.Sprintf("endpoint %s; by event id", wr.Endpoint())}
	if clicks.Dup > 0 {
		notes = append(notes, fmt.Sprintf("dup: %d deliveries again of an id already delivered (at-least-once: counted, not failed)", clicks.Dup))
	}
	for _, n := range []struct {
		n    uint64
		what string
	}{
		{unwanted, "clicks on links the filter does not want"},
		{unknown, "events on the run's links that were never sent"},
		{wrongLink, "clicks on another link than their click's"},
		{notClick, "events of another type than click"},
		{d.Unrecorded, "events not recorded: the receiver's bound was reached"},
	} {
		if n.n > 0 {
			notes = append(notes, fmt.Sprintf("%d %s", n.n, n.what))
		}
	}
	clicks.Note = strings.Join(notes, "; ")
	clicks.Status = Pass
	if clicks.Missing > 0 || clicks.Extra > 0 || d.Unrecorded > 0 {
		clicks.Status = Fail
	}

	sigs := Result{Sink: SinkWebhookSignatures, Expected: d.Requests, Got: d.Requests - d.BadSignatures - d.BadBodies,
		Extra: d.BadSignatures + d.BadBodies}
	sigs.Note = "each request verified with the Standard Webhooks library"
	if d.BadSignatures > 0 {
		sigs.Note += fmt.Sprintf("; %d failed verification (refused)", d.BadSignatures)
	}
	if d.BadBodies > 0 {
		sigs.Note += fmt.Sprintf("; %d verified but held no events", d.BadBodies)
	}
	sigs.judge()

	order := Result{Sink: SinkWebhookOrder}
	var wrong []string
	for code, fs := range byLink {
		order.Expected++
		sort.Slice(fs, func(i, j int) bool { return fs[i].first < fs[j].first })
		ok := true
		for i := 1; i < len(fs); i++ {
			if fs[i].logSeq < fs[i-1].logSeq {
				ok = false
				wrong = append(wrong, fmt.Sprintf("%s: CLICKS seq %d delivered after %d", code, fs[i].logSeq, fs[i-1].logSeq))
				break
			}
		}
		if ok {
			order.Got++
		} else {
			order.Missing++
		}
	}
	sort.Strings(wrong)
	order.Note = "links delivered to; each link's clicks first delivered in CLICKS order (one endpoint, live traffic: the service's promise)"
	if l := limitList("links out of order", wrong); l != "" {
		order.Note = l
	}
	order.judge()
	return []Result{clicks, sigs, order}
}
