package scenario

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
)

// A lesson's checks judge what was observed from outside the code it
// teaches about, not what that code says it did. Each check function is fed
// here an observation where the lesson's claim holds, and fabricated ones
// where it does not: the rows that claim what is false must FAIL.
func TestChecksFailWhenTheClaimIsFalse(t *testing.T) {
	t.Parallel()
	first := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	letter := deadletter.Letter{ID: "poison-id", Stream: events.ClicksStream, OrigSeq: 7, Attempts: 1, Time: first.Add(1300 * time.Millisecond)}
	poisoned := func(change func(*poisonSeen)) func(*Env) {
		s := poisonSeen{id: "poison-id", seq: 7, calls: poisonTries, firstTry: first, parked: 1, letter: letter}
		change(&s)
		return func(e *Env) { poisonChecks(e, s) }
	}
	outboxOK := outboxSeen{links: 43, once: 43, stored: 43, published: 53, twice: 10}
	hotOK := hotSeen{offered: 700, hotOffered: 600, tp6: 297, hot6: 199, hotBusy6: 0.87, hotBacklog6: 3200, coldBacklog6: 20, tp12: 294, hot12: 196, working12: 6, hotWorking12: 1}
	// What a starved machine measured (load average 17 on 2 cores): the
	// load not offered, both hot members far below their capacity, and
	// twelve a third ahead of six, by the scheduler's whim.
	hotStarved := hotSeen{offered: 484, hotOffered: 415, tp6: 108, hot6: 69, hotBusy6: 0.3, coldBusy6: 0.02, hotBacklog6: 2700, coldBacklog6: 150, tp12: 144, hot12: 89, working12: 6, hotWorking12: 1}
	// The kitchen's queue: 100 orders, one of them made by both cooks.
	// A making is the delivery's number, how long the cook held it (pull
	// to confirmed ack), its ack deadline and whether the ack was
	// confirmed.
	kitchen := func(orderMakings ...making) func(*Env) {
		return func(e *Env) {
			s := kitchenSeen{cook1: 50, cook2: 50}
			if len(orderMakings) > 0 {
				s.cook2++
				s.add(orderMakings)
			}
			kitchenQueueChecks(e, s)
		}
	}
	inTime := func(n uint64) making {
		return making{delivered: n, held: 30 * time.Millisecond, deadline: time.Second, confirmed: true}
	}
	heldPast := func(n uint64) making {
		return making{delivered: n, held: 1200 * time.Millisecond, deadline: time.Second, confirmed: true}
	}
	// Acked in 30 ms of real time, while the wall clock, which the
	// server times deliveries by, was stepped 1.2 s forward.
	wallStepped := func(n uint64) making {
		return making{delivered: n, held: 30 * time.Millisecond, heldWall: 1230 * time.Millisecond, deadline: time.Second, confirmed: true}
	}
	ackLost := func(n uint64) making {
		return making{delivered: n, held: 30 * time.Millisecond, deadline: time.Second, confirmed: false}
	}
	countDue := bpAlarms{countLatest: 50, countEarliest: 40}
	// What a starved machine measured of the rush's last event: 4,064
	// events left at the rush's end, 700 of them on its partition; the
	// reader handled 5,970 (197/s) in the 30.3 s until it, later arrivals
	// on the other partitions among them, and the partition drained its
	// 700 at 23/s. The whole backlog at the reader's rate says 20.6 s.
	rushStarved := rushLast{partition: 2, rushEvents: 8000, sentOnPart: 1120, onPartAtEnd: 420, onPartAtLast: 1120, atEnd: 3936, atLast: 3936 + 5970, wait: 30300 * time.Millisecond}
	tests := []struct {
		name   string
		checks func(e *Env)
		fail   []string // the rows that must FAIL, in table order
		// inconclusive: a premise is not met, and the rows that need it
		// are not judged.
		inconclusive bool
	}{
		{
			name:   "kitchen_claim_holds",
			checks: kitchen(),
		},
		{
			name:   "kitchen_order_made_twice_though_its_ack_came_in_time",
			checks: kitchen(inTime(1), inTime(2)),
			fail:   []string{"queue: orders made twice"},
		},
		{
			name:   "kitchen_order_handed_on_after_its_cook_held_it_past_the_deadline",
			checks: kitchen(inTime(2), heldPast(1)),
		},
		{
			name:   "kitchen_order_handed_on_after_its_ack_was_lost",
			checks: kitchen(ackLost(1), inTime(2)),
		},
		{
			name:   "kitchen_order_handed_on_after_the_wall_clock_stepped_past_its_deadline",
			checks: kitchen(wallStepped(1), inTime(2)),
		},
		{
			// Only the earlier delivery's lateness explains the second.
			name:   "kitchen_order_made_twice_with_only_the_second_delivery_late",
			checks: kitchen(heldPast(2), inTime(1)),
			fail:   []string{"queue: orders made twice"},
		},
		{
			name:   "rush_last_event_waits_for_its_partition",
			checks: func(e *Env) { rushLastWaitCheck(e, rushStarved) },
		},
		{
			// 350 later events of the partition handled before it,
			// beside the 700 ahead of it.
			name: "rush_last_event_overtaken_in_its_partition",
			checks: func(e *Env) {
				s := rushStarved
				s.onPartAtLast += 350
				rushLastWaitCheck(e, s)
			},
			fail: []string{"log: wait for the rush's last event"},
		},
		{
			// Only 450 of the 700 ahead of it handled before it.
			name: "rush_last_event_overtakes_its_partition",
			checks: func(e *Env) {
				s := rushStarved
				s.onPartAtLast -= 250
				rushLastWaitCheck(e, s)
			},
			fail: []string{"log: wait for the rush's last event"},
		},
		{
			// Handled before any of the 700 ahead of it: its partition
			// drained nothing until it, so the wait predicted is never.
			name: "rush_last_event_overtakes_its_whole_partition",
			checks: func(e *Env) {
				s := rushStarved
				s.onPartAtLast = s.onPartAtEnd
				rushLastWaitCheck(e, s)
			},
			fail: []string{"log: wait for the rush's last event"},
		},
		{
			name: "rush_caught_up_at_the_spare_capacity",
			checks: func(e *Env) {
				rushCatchUpCheck(e, rushCatchUp{backlog: 3000, caughtUp: true, took: 19.6, rate: 250, arrivals: 100})
			},
		},
		{
			name: "rush_caught_up_slower_than_the_spare_capacity",
			checks: func(e *Env) {
				rushCatchUpCheck(e, rushCatchUp{backlog: 3000, caughtUp: true, took: 30, rate: 250, arrivals: 100})
			},
			fail: []string{"log: catch-up time"},
		},
		{
			// What a starved machine measured: 5,294 left at the rush's
			// end, the reader at 164/s, and the run's end 41 s after the
			// rush, before the 83 s the drain takes at that rate.
			name:   "rush_not_caught_up_before_the_run_ended",
			checks: func(e *Env) { rushCatchUpCheck(e, rushCatchUp{backlog: 5294, took: 41, rate: 164, arrivals: 100}) },
		},
		{
			// A reader no faster than the 100/s arriving never drains it.
			name:   "rush_reader_below_the_arrivals_never_catches_up",
			checks: func(e *Env) { rushCatchUpCheck(e, rushCatchUp{backlog: 5294, took: 41, rate: 90, arrivals: 100}) },
		},
		{
			name: "rush_reader_below_the_arrivals_caught_up",
			checks: func(e *Env) {
				rushCatchUpCheck(e, rushCatchUp{backlog: 5294, caughtUp: true, took: 38, rate: 90, arrivals: 100})
			},
			fail: []string{"log: catch-up time"},
		},
		{
			// At 250/s the 3,000 drain in 20 s: still there after 41 s,
			// the backlog drained slower than the spare capacity.
			name:   "rush_not_caught_up_long_after_the_spare_capacity_drains_it",
			checks: func(e *Env) { rushCatchUpCheck(e, rushCatchUp{backlog: 3000, took: 41, rate: 250, arrivals: 100}) },
			fail:   []string{"log: catch-up time"},
		},
		{
			// A writer the machine starved after the rush: 20/s arrived
			// instead of 100/s, so the 3,000 drained in 13 s at 250/s,
			// not the lesson's 20 s. The premise is not met; the row is
			// not judged.
			name: "rush_caught_up_with_fewer_arrivals_than_the_lesson",
			checks: func(e *Env) {
				rushCatchUpCheck(e, rushCatchUp{backlog: 3000, caughtUp: true, took: 13, rate: 250, arrivals: 20})
			},
			inconclusive: true,
		},
		{
			// A writer that sent the 100/s late, in a burst: 160/s
			// arrived over the 41 s, and the 3,000 were not drained at
			// 250/s. Not judged either.
			name:         "rush_not_caught_up_with_more_arrivals_than_the_lesson",
			checks:       func(e *Env) { rushCatchUpCheck(e, rushCatchUp{backlog: 3000, took: 41, rate: 250, arrivals: 160}) },
			inconclusive: true,
		},
		{
			name:   "outbox_claim_holds",
			checks: func(e *Env) { outboxChecks(e, outboxOK) },
		},
		{
			name: "outbox_stream_kept_the_second_copies",
			checks: func(e *Env) {
				s := outboxOK
				s.once, s.stored = 33, 53 // ten links with two events in LINKS
				outboxChecks(e, s)
			},
			fail: []string{"outbox: links with exactly one event in LINKS"},
		},
		{
			name: "outbox_relay_never_sent_twice",
			checks: func(e *Env) {
				s := outboxOK
				s.published, s.twice = 43, 0
				outboxChecks(e, s)
			},
			fail: []string{"outbox: events sent twice (seen on the wire)"},
		},
		{
			name: "outbox_rolled_back_links_written",
			checks: func(e *Env) {
				s := outboxOK
				s.links, s.once, s.stored = 50, 50, 50
				outboxChecks(e, s)
			},
			fail: []string{"outbox: links written (every 7th rolled back)", "outbox: links with exactly one event in LINKS"},
		},
		{
			name:   "poison_claim_holds",
			checks: poisoned(func(*poisonSeen) {}),
		},
		{
			name:   "poison_server_redelivered_it",
			checks: poisoned(func(s *poisonSeen) { s.letter.Attempts = poisonTries }),
			fail:   []string{"dead letter: deliveries the server recorded"},
		},
		{
			name:   "poison_parked_without_backoff",
			checks: poisoned(func(s *poisonSeen) { s.letter.Time = first.Add(10 * time.Millisecond) }),
			fail:   []string{"first try to the letter's stored time (real s)"},
		},
		{
			name:   "poison_letter_names_another_event",
			checks: poisoned(func(s *poisonSeen) { s.letter.ID = "other-id" }),
			fail:   []string{"dead letter: the CLICKS sequence it names"},
		},
		{
			name:   "poison_runtime_ignored_poison",
			checks: poisoned(func(s *poisonSeen) { s.calls = poisonTries + 3 }),
			fail:   []string{"snip: handler calls with the poison event"},
		},
		{
			name:   "poison_nothing_parked",
			checks: poisoned(func(s *poisonSeen) { s.parked, s.letter = 0, deadletter.Letter{} }),
			fail: []string{
				"dead letters (snip, bad_target)", "dead letter: the CLICKS sequence it names",
				"dead letter: deliveries the server recorded", "first try to the letter's stored time (real s)",
			},
		},
		{
			name:   "alarms_age_first",
			checks: func(e *Env) { alarmOrderChecks(e, countDue, 17, 50) },
		},
		{
			name:   "alarms_count_first",
			checks: func(e *Env) { alarmOrderChecks(e, countDue, 52, 50) },
			fail:   []string{"count alarm's time minus the age alarm's"},
		},
		{
			name:   "alarms_in_the_same_sample",
			checks: func(e *Env) { alarmOrderChecks(e, countDue, 50, 50) },
			fail:   []string{"count alarm's time minus the age alarm's"},
		},
		{
			name:   "alarms_count_never_fired",
			checks: func(e *Env) { alarmOrderChecks(e, countDue, 17, 0) },
			fail: []string{
				"count alarm (10,000) fires no later than the counters say",
				"count alarm (10,000) fires no earlier than with full batches in hand",
				"count alarm's time minus the age alarm's",
			},
		},
		{
			name:   "hot_claim_holds",
			checks: func(e *Env) { hotChecks(e, hotOK) },
		},
		{
			name: "hot_twelve_share_the_hot_link",
			checks: func(e *Env) {
				s := hotOK
				s.tp12, s.hot12, s.working12, s.hotWorking12 = 690, 590, 12, 6
				hotChecks(e, s)
			},
			fail: []string{
				"twelve: hot partition's rate", "twelve: members that handled the hot partition", "twelve: members that handled events",
				"twelve: group throughput", "group throughput, twelve / six (side by side)",
			},
		},
		{
			name: "hot_twelve_a_fifth_better",
			checks: func(e *Env) {
				s := hotOK
				s.tp12 = s.tp6 * 1.2
				hotChecks(e, s)
			},
			fail: []string{"twelve: group throughput", "group throughput, twelve / six (side by side)"},
		},
		{
			// The hot link's events spread over the partitions: no member
			// is saturated, on a machine that keeps up.
			name: "hot_link_spread_out",
			checks: func(e *Env) {
				s := hotOK
				s.hotOffered, s.hot6, s.hot12, s.hotBacklog6 = 100, 98, 97, 16
				s.tp6, s.tp12 = 690, 688
				hotChecks(e, s)
			},
			fail: []string{"six: hot partition's backlog after 8 s", "twelve: group throughput"},
		},
		{
			name:         "hot_machine_too_busy",
			checks:       func(e *Env) { hotChecks(e, hotStarved) },
			inconclusive: true,
		},
		{
			name: "hot_machine_too_busy_and_two_members_share_the_hot_link",
			checks: func(e *Env) {
				s := hotStarved
				s.hotWorking12, s.working12 = 2, 7
				hotChecks(e, s)
			},
			fail:         []string{"twelve: members that handled the hot partition"},
			inconclusive: true,
		},
		{
			name: "hot_machine_too_busy_and_the_hot_link_spread_over_twelve",
			checks: func(e *Env) {
				s := hotStarved
				s.tp12, s.hot12, s.hotWorking12, s.working12 = 400, 300, 12, 12
				hotChecks(e, s)
			},
			fail:         []string{"twelve: hot partition's rate", "twelve: members that handled the hot partition", "twelve: group throughput"},
			inconclusive: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := &Env{speed: 1, res: &Result{}}
			tc.checks(e)
			e.res.judge()
			if diff := cmp.Diff(tc.fail, e.res.failed()); diff != "" {
				t.Errorf("rows that FAIL (-want +got):\n%s", diff)
			}
			if got := e.res.Inconclusive != ""; got != tc.inconclusive {
				t.Errorf("inconclusive = %v (%q), want %v", got, e.res.Inconclusive, tc.inconclusive)
			}
			if e.res.Pass != (len(tc.fail) == 0) {
				t.Errorf("pass = %v with rows that FAIL %q", e.res.Pass, tc.fail)
			}
		})
	}
}

// An order made twice though each ack came in time fails the row, and a
// note names every making of it, so the failure says what happened: the
// cook, the subject, the delivery and consumer sequence, when it was pulled,
// received and acked, and the deliveries no cook received.
func TestKitchenNamesEveryMakingOfAnOrderMadeTwice(t *testing.T) {
	t.Parallel()
	e := &Env{speed: 1, res: &Result{}}
	s := kitchenSeen{cook1: 51, cook2: 50}
	s.add([]making{
		{cook: "cook-2", subject: events.PreviewJobSubject, delivered: 2, seq: 65, cseq: 104, held: 40 * time.Millisecond, heldWall: 40 * time.Millisecond, deadline: 2 * time.Second, confirmed: true,
			pulled: 2300 * time.Millisecond, received: 2310 * time.Millisecond, acked: 2340 * time.Millisecond},
		{cook: "cook-1", subject: events.PreviewJobSubject, delivered: 1, seq: 65, cseq: 66, held: 30 * time.Millisecond, heldWall: 30 * time.Millisecond, deadline: time.Second, confirmed: true,
			pulled: 1200 * time.Millisecond, received: 1210 * time.Millisecond, acked: 1230 * time.Millisecond},
	})
	s.unseen = []uint64{67}
	kitchenQueueChecks(e, s)
	e.res.judge()
	if diff := cmp.Diff([]string{"queue: orders made twice"}, e.res.failed()); diff != "" {
		t.Errorf("rows that FAIL (-want +got):\n%s", diff)
	}
	notes := strings.Join(e.res.Notes, "\n")
	for _, want := range []string{
		"[1] cook-1: delivery 1 (consumer sequence 66) of sequence 65 on " + events.PreviewJobSubject + ", pulled at 1.2s, received at 1.21s, ack confirmed at 1.23s: held 30ms of its 1s",
		"[2] cook-2: delivery 2 (consumer sequence 104) of sequence 65 on " + events.PreviewJobSubject + ", pulled at 2.3s, received at 2.31s, ack confirmed at 2.34s: held 40ms of its 2s",
		"no cook received (consumer sequences): [67]",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("the notes do not say %q; they are:\n%s", want, notes)
		}
	}
}

func TestUnseenDeliveries(t *testing.T) {
	t.Parallel()
	got := unseenDeliveries([]making{{cseq: 1}, {cseq: 4}, {cseq: 2}, {cseq: 7}})
	if diff := cmp.Diff([]uint64{3, 5, 6}, got); diff != "" {
		t.Errorf("unseen deliveries (-want +got):\n%s", diff)
	}
}
