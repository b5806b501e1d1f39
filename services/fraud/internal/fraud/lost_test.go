package fraud_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/clicklog"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/fraudpub"
	"github.com/snipdev/snip/services/fraud/internal/kvorigin"
	"github.com/snipdev/snip/services/fraud/internal/redisstore"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// TestEventsRedisLostAreHandedAgain: Redis loses acknowledged writes (the
// database is put back to a snapshot taken after the first batch, as a
// replica promoted after its master died, or a crash with appendfsync
// everysec, leaves it): the partition's mark goes back from 25 to 10. The
// next batch finds it behind what was applied, writes nothing, and asks the
// runtime (reader.Replay) for the partition's events again from 11; judged
// again, they are applied once, and nothing is published twice. The same
// member notices from the mark it keeps in memory; a member that takes the
// partition over after the loss notices from the log, which holds events
// before its resume point that the store lacks.
func TestEventsRedisLostAreHandedAgain(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"same_member", "after_a_takeover"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			ctx := t.Context()
			// A burst: it fires at the 21st click (an alert, 21 labels) in
			// the batch Redis loses, and labels every click after.
			p, evs := w.hotBurst(t)
			reg := prometheus.NewRegistry()
			r := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
			if err := r.OnAssign(ctx, p, 1); err != nil {
				t.Fatal(err)
			}
			handle(t, r, p, evs[:10])
			snap := testenv.SnapshotRedis(t, w.rdb)
			handle(t, r, p, evs[10:25])
			snap.Restore(t, w.rdb) // acked, and lost
			if how == "after_a_takeover" {
				r.OnRevoke(p)
				reg = prometheus.NewRegistry()
				r = w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
				if err := r.OnAssign(ctx, p, evs[25].Seq); err != nil {
					t.Fatal(err)
				}
			}

			err := r.Handle(ctx, p, evs[25:])
			var re *reader.ReplayError
			if !errors.As(err, &re) || re.From != evs[10].Seq || !errors.Is(err, fraud.ErrStoreBehind) {
				t.Fatalf("the batch after the loss: %v, want a replay from %d", err, evs[10].Seq)
			}
			if hwm, _ := w.store.HighWater(ctx, p); hwm != evs[9].Seq {
				t.Fatalf("the batch after the loss moved the mark to %d; it must write nothing", hwm)
			}
			handle(t, r, p, w.events(t, p, re.From)) // what the runtime hands after the replay

			st, err := w.store.LinkStats(ctx, "hot")
			if err != nil || st.Total != 30 || st.Flagged != 30 || st.ByRule[fraud.RuleVisitorBurst] != 30 {
				t.Fatalf("stats = %+v, %v; want 30 of 30 flagged by visitor_burst", st, err)
			}
			want := fraud.AlertID(fraud.RuleVisitorBurst, "hot", "bot", evs[20].Click.Time.Truncate(time.Hour))
			stored, err := w.store.RecentAlerts(ctx, "acme", 10)
			if err != nil || len(stored) != 1 || stored[0].ID != want {
				t.Fatalf("alerts in Redis = %+v, %v; want %s", stored, err, want)
			}
			if got := w.fraudMsgs(t, "fraud.alerts.>"); len(got) != 1 || got[want] != 1 {
				t.Fatalf("alerts on FRAUD = %v, want one %s", got, want)
			}
			v, _ := w.verdictLabels(t)
			for i, e := range evs {
				if v[e.Click.ID] != 1 {
					t.Fatalf("click %d: %d labels, want 1", i+1, v[e.Click.ID])
				}
			}
			if got := counter(t, reg, "snip_fraud_publish_duplicates_total"); got != 0 {
				t.Fatalf("%v alerts or verdicts published again, want 0", got)
			}
			if got := counter(t, reg, "snip_fraud_store_replays_total"); got != 1 {
				t.Fatalf("snip_fraud_store_replays_total = %v, want 1", got)
			}
		})
	}
}

// handleReplaying hands r partition p's events from from, in batches of
// size, as the runtime does, and hands them again from where the handler
// asks (reader.Replay). It returns the sequences the replays started at.
func (w *world) handleReplaying(t *testing.T, r *fraud.Reader, p int, from uint64, size int) []uint64 {
	t.Helper()
	var replays []uint64
	evs := w.events(t, p, from)
	for len(evs) > 0 {
		n := min(size, len(evs))
		err := r.Handle(t.Context(), p, evs[:n])
		var re *reader.ReplayError
		if errors.As(err, &re) {
			if re.From > evs[0].Seq || len(replays) == 3 {
				t.Fatalf("replay from %d asked for a batch from %d (replays before: %v)", re.From, evs[0].Seq, replays)
			}
			replays = append(replays, re.From)
			evs = w.events(t, p, re.From)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = evs[n:]
	}
	return replays
}

// TestStatisticsRedisLostAltogetherAreCountedAgain: Redis loses every fraud
// key of a partition (a failover to an empty replica, a FLUSHALL, a restore
// from an empty snapshot), so the partition's mark reads 0, as for a
// partition never processed. curl clicked a link 8 times from 10:00 to
// 10:07 (judged, their label counter stored), people clicked it until
// 10:29, and after the loss curl clicks 5 more times from 10:31: 13 labels
// in the hour, which an uninterrupted member raises bot_agent for. A
// member taking the partition over after the loss (or restarted: a new
// process takes it over the same way) rebuilds only the ten minutes before
// its resume point, which hold none of curl's first 8; the same member,
// running through the loss, finds the mark gone back. Either way the
// record of where the partition's statistics began (kept in NATS) tells
// the loss from a partition never processed: the events are handed again
// from there and judged again quietly, the statistics, the alert list and
// the counter are counted again, bot_agent is raised with the uninterrupted
// member's ID, and nothing is published twice.
func TestStatisticsRedisLostAltogetherAreCountedAgain(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"after_a_takeover", "same_member"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			ctx := t.Context()
			rules := shortMemory()
			d, _ := fraud.NewDetector(rules)
			code := "curled"
			p := events.Partition(code, parts)
			ten := time.Now().Add(-3 * time.Hour).Truncate(time.Hour)
			curl := agentClicks(ten, 8, time.Minute, code, "curl/8.5.0")
			w.publishAged(t, d.Memory(), curl)
			people := traffic.Burst(ten.Add(8*time.Minute), 22, time.Minute, code, "acme", "")
			for i := range people {
				people[i].Visitor = fmt.Sprintf("person%d", i)
			}
			if err := traffic.Publish(ctx, w.js, people, 64); err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			r := w.reader(t, rules, fraud.NewMetrics(reg))
			if err := r.OnAssign(ctx, p, 1); err != nil {
				t.Fatal(err)
			}
			all := w.events(t, p, 1)
			handle(t, r, p, all[:8])
			handle(t, r, p, all[8:19])
			handle(t, r, p, all[19:])
			resume := all[len(all)-1].Seq + 1
			more := agentClicks(ten.Add(31*time.Minute), 5, time.Minute, code, "curl/8.5.0")
			if err := traffic.Publish(ctx, w.js, more, 64); err != nil {
				t.Fatal(err)
			}

			if err := w.rdb.FlushDB(ctx).Err(); err != nil { // acked, and all lost
				t.Fatal(err)
			}
			if how == "after_a_takeover" {
				r.OnRevoke(p)
				reg = prometheus.NewRegistry()
				r = w.reader(t, rules, fraud.NewMetrics(reg))
				if err := r.OnAssign(ctx, p, resume); err != nil {
					t.Fatal(err)
				}
			}
			replays := w.handleReplaying(t, r, p, resume, 100)

			want := uninterrupted(t, rules, w.events(t, p, 1))
			if len(want) != 1 || want[0] != fraud.AlertID(fraud.RuleBotAgent, code, "curl", ten) {
				t.Fatalf("the uninterrupted member raises %v, want one bot_agent alert", want)
			}
			if got := w.fraudMsgs(t, "fraud.alerts.>"); len(got) != 1 || got[want[0]] != 1 {
				t.Fatalf("alerts on FRAUD = %v, want %v", got, want)
			}
			if stored, err := w.store.RecentAlerts(ctx, "acme", 10); err != nil || len(stored) != 1 || stored[0].ID != want[0] {
				t.Fatalf("alerts in Redis = %+v, %v; want %v", stored, err, want)
			}
			st, err := w.store.LinkStats(ctx, code)
			if err != nil || st.Total != 35 || st.Flagged != 13 || st.ByRule[fraud.RuleBotAgent] != 13 {
				t.Fatalf("stats = %+v, %v; want 13 of 35 flagged by bot_agent", st, err)
			}
			v, _ := w.verdictLabels(t)
			for i, c := range append(curl, more...) {
				if v[c.ID] != 1 {
					t.Fatalf("curl click %d: %d labels, want 1", i+1, v[c.ID])
				}
			}
			if len(v) != 13 {
				t.Fatalf("%d clicks labelled, want 13", len(v))
			}
			if len(replays) != 1 || replays[0] != all[0].Seq {
				t.Fatalf("replays from %v, want one from %d (where the statistics began)", replays, all[0].Seq)
			}
			for name, want := range map[string]float64{
				"snip_fraud_store_wiped_total": 1, "snip_fraud_store_replays_total": 1,
				"snip_fraud_store_unrecoverable_total": 0, "snip_fraud_publish_duplicates_total": 0,
			} {
				if got := counter(t, reg, name); got != want {
					t.Fatalf("%s = %v, want %v", name, got, want)
				}
			}
		})
	}
}

// TestAPartitionNeverProcessedIsNotTakenForALoss: a group that started at
// `new` finds events of the partition in the log before its resume point
// and no mark in Redis, as after a loss; with no record of statistics
// applied, it is no loss. Nothing is handed again, only what follows is
// counted, and the first batch records where the statistics begin.
func TestAPartitionNeverProcessedIsNotTakenForALoss(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p, evs := w.hotBurst(t)
	reg := prometheus.NewRegistry()
	r := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	if err := r.OnAssign(ctx, p, evs[20].Seq); err != nil {
		t.Fatal(err)
	}
	if replays := w.handleReplaying(t, r, p, evs[20].Seq, 100); len(replays) != 0 {
		t.Fatalf("replays from %v, want none", replays)
	}
	if st, err := w.store.LinkStats(ctx, "hot"); err != nil || st.Total != 10 {
		t.Fatalf("stats = %+v, %v; want 10 clicks counted", st, err)
	}
	if got, err := kvorigin.New(w.js, topology.GroupFraudDetection).Origin(ctx, p); err != nil || got != evs[20].Seq {
		t.Fatalf("recorded origin = %d, %v; want %d", got, err, evs[20].Seq)
	}
	for _, name := range []string{"snip_fraud_store_wiped_total", "snip_fraud_store_replays_total", "snip_fraud_store_unrecoverable_total"} {
		if got := counter(t, reg, name); got != 0 {
			t.Fatalf("%s = %v, want 0", name, got)
		}
	}
}

// TestStatisticsLostBeyondRetentionAreReported: Redis loses every fraud key
// of a partition after retention discarded the first events its statistics
// held (CLICKS cut to its newest 15 events). Those cannot be counted again:
// the member taking the partition over says so (the log line and
// snip_fraud_store_unrecoverable_total) and counts again what the log still
// holds, from its first event of the partition.
func TestStatisticsLostBeyondRetentionAreReported(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	clicks := traffic.Burst(time.Now().Add(-time.Minute), 35, 500*time.Millisecond, "hot", "acme", "bot")
	p := lostBeyondRetention(t, w, clicks, 35)

	reg := prometheus.NewRegistry()
	r := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	if err := r.OnAssign(ctx, p, 31); err != nil {
		t.Fatal(err)
	}
	if replays := w.handleReplaying(t, r, p, 31, 100); len(replays) != 1 || replays[0] != 21 {
		t.Fatalf("replays from %v, want one from 21 (the first event the log holds)", replays)
	}
	if st, err := w.store.LinkStats(ctx, "hot"); err != nil || st.Total != 15 {
		t.Fatalf("stats = %+v, %v; want the 15 clicks the log holds counted", st, err)
	}
	for name, want := range map[string]float64{
		"snip_fraud_store_wiped_total": 1, "snip_fraud_store_unrecoverable_total": 1, "snip_fraud_store_replays_total": 1,
	} {
		if got := counter(t, reg, name); got != want {
			t.Fatalf("%s = %v, want %v", name, got, want)
		}
	}
}

// TestStatisticsLostForGoodAreReportedOnce: as in
// TestStatisticsLostBeyondRetentionAreReported, Redis loses every fraud key
// of a partition after retention discarded the first 20 events its
// statistics held; they are reported lost and the 15 events the log holds
// counted again. Then Redis loses everything again. The events 1-20 were
// lost in the first loss, not this one, and everything this one lost the
// log holds: it is counted again in full (a replay from 21) and reported
// as a loss (snip_fraud_store_wiped_total), but nothing is reported lost for
// good (snip_fraud_store_unrecoverable_total, the error line). Before, the
// record of where the partition's statistics begin still said 1, and every
// later loss reported 1-20 lost again. Found by a member taking the
// partition over, and by the member running through the loss.
func TestStatisticsLostForGoodAreReportedOnce(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"after_a_takeover", "same_member"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			ctx := t.Context()
			clicks := traffic.Burst(time.Now().Add(-time.Minute), 37, 500*time.Millisecond, "hot", "acme", "bot")
			p := lostBeyondRetention(t, w, clicks, 35)

			// The first loss: 1-20 lost for good, 21-35 counted again.
			reg := prometheus.NewRegistry()
			r := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
			if err := r.OnAssign(ctx, p, 31); err != nil {
				t.Fatal(err)
			}
			if replays := w.handleReplaying(t, r, p, 31, 100); len(replays) != 1 || replays[0] != 21 {
				t.Fatalf("first loss: replays from %v, want one from 21", replays)
			}
			if got := counter(t, reg, "snip_fraud_store_unrecoverable_total"); got != 1 {
				t.Fatalf("first loss: snip_fraud_store_unrecoverable_total = %v, want 1", got)
			}

			// The second loss, of 21-35 only, which the log holds.
			if err := w.rdb.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			resume := uint64(36)
			if how == "after_a_takeover" {
				r.OnRevoke(p)
				reg = prometheus.NewRegistry()
				r = w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
				if err := r.OnAssign(ctx, p, resume); err != nil {
					t.Fatal(err)
				}
			}
			// Two more clicks, which retention no longer cuts: the member
			// running through the loss finds it at its next batch.
			w.keepClicks(t, -1)
			if err := traffic.Publish(ctx, w.js, clicks[35:], 64); err != nil {
				t.Fatal(err)
			}
			if replays := w.handleReplaying(t, r, p, resume, 100); len(replays) != 1 || replays[0] != 21 {
				t.Fatalf("second loss: replays from %v, want one from 21 (where the statistics began again)", replays)
			}
			if st, err := w.store.LinkStats(ctx, "hot"); err != nil || st.Total != 17 {
				t.Fatalf("stats = %+v, %v; want the 17 clicks of 21-37 counted", st, err)
			}
			// The same member's registry holds the first loss too.
			wiped, unrecoverable := 1.0, 0.0
			if how == "same_member" {
				wiped, unrecoverable = 2, 1
			}
			for name, want := range map[string]float64{
				"snip_fraud_store_wiped_total": wiped, "snip_fraud_store_unrecoverable_total": unrecoverable,
			} {
				if got := counter(t, reg, name); got != want {
					t.Errorf("second loss: %s = %v, want %v", name, got, want)
				}
			}
		})
	}
}

// TestAWipeIsCountedOnceWhenItsRebuildIsRetried: Redis loses every fraud
// key of a partition after retention discarded the first events its
// statistics held (CLICKS cut to its newest 14 events), and the rebuild
// that finds the loss fails the first time: NATS refuses the member the
// consumer it reads the log with. The runtime tries OnAssign again, or the
// batch again, until the rebuild succeeds. One wipe, part of it lost for
// good: snip_fraud_store_wiped_total and
// snip_fraud_store_unrecoverable_total count it once each, not once a try.
func TestAWipeIsCountedOnceWhenItsRebuildIsRetried(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"after_a_takeover", "same_member"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			w, refuse := newRefusingWorld(t)
			p := events.Partition("hot", parts)
			other := "other"
			for i := 0; events.Partition(other, parts) == p; i++ {
				other = fmt.Sprintf("other%d", i)
			}
			// 1-10 and 12-24 on "hot", 11 on another partition.
			hot := traffic.Burst(time.Now().Add(-time.Minute), 23, 500*time.Millisecond, "hot", "acme", "bot")
			for _, cs := range [][]traffic.Click{hot[:10], traffic.Burst(time.Now(), 1, 0, other, "acme", "x"), hot[10:]} {
				if err := traffic.Publish(ctx, w.js, cs, 64); err != nil {
					t.Fatal(err)
				}
			}
			reg := prometheus.NewRegistry()
			r := w.memberReader(t, fraud.NewMetrics(reg))
			if err := r.OnAssign(ctx, p, 1); err != nil {
				t.Fatal(err)
			}
			if evs := w.events(t, p, 1); len(evs) != 23 || evs[9].Seq != 10 || evs[10].Seq != 12 {
				t.Fatalf("the partition's events are %d, want 1-10 and 12-24", len(evs))
			}
			// 1-21 judged, stored and acked, then all lost.
			handle(t, r, p, w.events(t, p, 1)[:20])
			if err := w.rdb.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			s := w.keepClicks(t, 14)
			testenv.WaitFor(t, 10*time.Second, "events 1-10 discarded", func() bool {
				info, err := s.Info(ctx)
				return err == nil && info.State.FirstSeq == 11
			})

			refuse("$JS.API.CONSUMER.CREATE." + events.ClicksStream + ".>")
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a refused request is not answered
			defer cancel()
			if how == "after_a_takeover" {
				r.OnRevoke(p)
				reg = prometheus.NewRegistry()
				r = w.memberReader(t, fraud.NewMetrics(reg))
				if err := r.OnAssign(fctx, p, 22); err == nil {
					t.Fatal("OnAssign succeeded without reading the log")
				}
			} else {
				err := r.Handle(fctx, p, w.events(t, p, 22))
				if re := (*reader.ReplayError)(nil); err == nil || errors.As(err, &re) {
					t.Fatalf("the batch after the loss: %v, want a failure", err)
				}
			}
			refuse()
			if how == "after_a_takeover" {
				if err := r.OnAssign(ctx, p, 22); err != nil { // the runtime's retry
					t.Fatal(err)
				}
			}
			if replays := w.handleReplaying(t, r, p, 22, 100); len(replays) != 1 || replays[0] != 12 {
				t.Fatalf("replays from %v, want one from 12 (the partition's first event the log holds)", replays)
			}
			if st, err := w.store.LinkStats(ctx, "hot"); err != nil || st.Total != 13 {
				t.Fatalf("stats = %+v, %v; want the 13 clicks the log holds counted", st, err)
			}
			for name, want := range map[string]float64{
				"snip_fraud_store_wiped_total": 1, "snip_fraud_store_unrecoverable_total": 1, "snip_fraud_store_replays_total": 1,
			} {
				if got := counter(t, reg, name); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
		})
	}
}

// newRefusingWorld is a world whose NATS server has a user "member" for
// memberReader, and refuse, which has the server refuse the member publishes
// (requests) to the subjects given from now on, none when none are given.
func newRefusingWorld(t *testing.T) (*world, func(deny ...string)) {
	t.Helper()
	opts := testenv.NATSOptions(server.RANDOM_PORT, filepath.Join(t.TempDir(), "jetstream"))
	users := func(deny ...string) []*server.User {
		return []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "member", Password: "member", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
			}},
		}
	}
	opts.Users = users()
	srv, err := testenv.RunNATSServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := "nats://" + srv.Addr().String()
	nc, err := nats.Connect(url, nats.UserInfo("admin", "admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	o := topology.Defaults()
	o.Partitions = parts
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	rdb, _ := servers.Redis.NewDB(t)
	w := &world{url: url, memberOpts: []nats.Option{nats.UserInfo("member", "member")}, nc: nc, js: js, rdb: rdb, store: redisstore.New(rdb, parts, 100)}
	return w, func(deny ...string) {
		o := opts
		o.Users = users(deny...)
		if err := srv.ReloadOptions(&o); err != nil {
			t.Fatal(err)
		}
	}
}

// memberReader is a reader on its own connection as w.memberOpts' user.
func (w *world) memberReader(t *testing.T, m *fraud.Metrics) *fraud.Reader {
	t.Helper()
	// The refusals are what the test is about: not written to stderr.
	quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
	nc, err := nats.Connect(w.url, append(w.memberOpts, quiet)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	d, err := fraud.NewDetector(fraud.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := fraudpub.New(nc, 256, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return fraud.NewReader(d, clicklog.New(js, parts), pub, w.store, kvorigin.New(js, topology.GroupFraudDetection), slog.New(slog.DiscardHandler), m)
}

// lostBeyondRetention publishes the first 30 clicks (of link "hot"), has a
// reader judge them, then Redis loses every key (FLUSHDB) and CLICKS is cut
// to its newest 15 events before clicks 31 to upTo are published: events
// 1-20 are gone from the log, so their statistics are lost for good. It
// returns the partition.
func lostBeyondRetention(t *testing.T, w *world, clicks []traffic.Click, upTo int) int {
	t.Helper()
	ctx := t.Context()
	p := events.Partition("hot", parts)
	if err := traffic.Publish(ctx, w.js, clicks[:30], 64); err != nil {
		t.Fatal(err)
	}
	first := w.reader(t, fraud.Defaults(), nil)
	if err := first.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	handle(t, first, p, w.events(t, p, 1))
	first.OnRevoke(p)
	if err := w.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s := w.keepClicks(t, 15)
	if err := traffic.Publish(ctx, w.js, clicks[30:upTo], 64); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "clicks 1-20 discarded", func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.FirstSeq == 21
	})
	return p
}

// keepClicks makes CLICKS keep at most its last n messages (-1: no limit)
// and returns the stream.
func (w *world) keepClicks(t *testing.T, n int64) jetstream.Stream {
	t.Helper()
	s, err := w.js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = n
	if _, err := w.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	return s
}
