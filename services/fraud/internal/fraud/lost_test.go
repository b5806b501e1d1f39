package fraud_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
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
			if got := counter(t, reg, "fraud_publish_duplicates_total"); got != 0 {
				t.Fatalf("%v alerts or verdicts published again, want 0", got)
			}
			if got := counter(t, reg, "fraud_store_replays_total"); got != 1 {
				t.Fatalf("fraud_store_replays_total = %v, want 1", got)
			}
		})
	}
}
