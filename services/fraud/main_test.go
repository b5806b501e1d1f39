package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/service/servicetest"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

const partitions = 4

// Owners of the generated traffic (owner0..owner2) and their API keys.
var ownerKeys = map[string]string{"owner0": "snip_owner0owner0owner0owner0", "owner1": "snip_owner1owner1owner1owner1", "owner2": "snip_owner2owner2owner2owner2", "acme": "snip_acmeacmeacmeacmeacmeacme"}

func bootstrapSpec() string {
	var parts []string
	for o, k := range ownerKeys {
		parts = append(parts, o+":"+k)
	}
	return strings.Join(parts, ",")
}

// instance is one running fraud service.
type instance struct {
	*servicetest.Running
	addr string
	nc   *nats.Conn
}

// start runs the service in-process against n and Redis database db.
func start(t *testing.T, n *testenv.NATS, db int, member string, extra ...string) *instance {
	t.Helper()
	environ := append([]string{
		"NATS_URL=" + n.URL, "REDIS_URL=" + servers.Redis.URL(db), "HTTP_ADDR=127.0.0.1:0",
		"SNIP_PARTITIONS=" + strconv.Itoa(partitions), "FRAUD_MEMBER=" + member,
		"SNIP_BOOTSTRAP_OWNERS=" + bootstrapSpec(), "SHUTDOWN_TIMEOUT=10s",
	}, extra...)
	cfg, err := loadConfig(environ, nil)
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{}
	var once sync.Once
	cfg.Connected = func(nc *nats.Conn) { once.Do(func() { in.nc = nc }) }
	log := slog.New(slog.NewJSONHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	in.Running = servicetest.Start(t, func(ctx context.Context, ready func(string)) error {
		cfg.Ready = ready
		return run(ctx, log, cfg)
	})
	in.addr = in.Addr
	return in
}

// stop stops the service as SIGTERM would and waits for its graceful exit.
func (in *instance) stop(t *testing.T) {
	if err := in.Stop(); err != nil {
		t.Errorf("service exit: %v", err)
	}
}

// crash cuts the member off NATS at once, as kill -9 would (no ack, no
// unpin, no lease delete), then lets its process go.
func (in *instance) crash(t *testing.T) {
	in.nc.Close()
	if err := in.Stop(); errors.Is(err, servicetest.ErrStopTimeout) {
		t.Fatalf("crashed service did not exit: %v", err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// metric returns the value of one series from /metrics, or -1.
func (in *instance) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + in.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && name == series {
			v, _ := strconv.ParseFloat(value, 64)
			return v
		}
	}
	return -1
}

// runtimeEvents sums snip_reader_events_total over the partitions.
func (in *instance) runtimeEvents(t *testing.T) float64 {
	sum := 0.0
	for p := range partitions {
		if v := in.metric(t, fmt.Sprintf(`snip_reader_events_total{group="fraud-detection",partition="%d"}`, p)); v > 0 {
			sum += v
		}
	}
	return sum
}

func (in *instance) get(t *testing.T, path, key string, into any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+in.addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && into != nil {
		if err := json.Unmarshal(b, into); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode
}

// caughtUp reports whether the group has acked every event of every partition.
func caughtUp(t *testing.T, js jetstream.JetStream) bool {
	lag, err := reader.Lag(t.Context(), js, topology.GroupFraudDetection)
	if err != nil || len(lag) != partitions {
		return false
	}
	stream, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		return false
	}
	for _, l := range lag {
		if l.Pending != 0 || l.AckPending != 0 {
			return false
		}
		// The server counts a message into a consumer's pending a moment
		// after its PubAck: the ack floor must also have reached the
		// partition's last message, or a poll just after a publish reads
		// "caught up" before the group has seen it.
		last, err := stream.GetLastMsgForSubject(t.Context(), events.PartitionFilter(l.Partition))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound): // nothing in this partition
		case err != nil:
			return false
		case l.AckFloor < last.Sequence:
			return false
		}
	}
	return true
}

// fraudIDs returns the Nats-Msg-Id of every FRAUD message on filter, with
// how many messages carry each.
// fraudLabels returns how many labels of FRAUD_VERDICTS name each click.
func fraudLabels(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	labels, _, err := traffic.VerdictLabels(t.Context(), js)
	if err != nil {
		t.Fatal(err)
	}
	return labels
}

func fraudIDs(t *testing.T, js jetstream.JetStream, filter string) map[string]int {
	t.Helper()
	ids, err := traffic.MsgIDs(t.Context(), js, events.FraudStream, filter)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestGeneratedMixEndToEnd runs the service on generated traffic through
// NATS, the reader runtime and Redis: every injected bot pattern is flagged
// (by the redirect's label or a verdict on FRAUD), at most 1% of people's
// clicks are, and the API shows each owner their alerts and flagged share.
func TestGeneratedMixEndToEnd(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	_, db := servers.Redis.NewDB(t)
	svc := start(t, n, db, "m1")

	spec := traffic.Spec{Seed: 42, Start: time.Now().Add(-15 * time.Minute), Duration: 10 * time.Minute, HumanRate: 20, Links: 60, Owners: 3, Inject: true}
	clicks := traffic.Generate(spec)
	if err := traffic.Publish(t.Context(), js, clicks, 512); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "the group to catch up", func() bool { return caughtUp(t, js) })

	verdicts := fraudLabels(t, js)
	flagged, total := map[string]int{}, map[string]int{}
	for _, c := range clicks {
		total[c.Pattern]++
		if n := verdicts[c.ID]; n > 0 || c.Bot {
			flagged[c.Pattern]++
		}
	}
	for _, p := range []string{traffic.PatternBurst, traffic.PatternScanner, traffic.PatternFlood, traffic.PatternPair, traffic.PatternPreview} {
		t.Logf("%-8s flagged %5d of %5d", p, flagged[p], total[p])
		if total[p] == 0 || flagged[p] != total[p] {
			t.Errorf("pattern %s: %d of %d clicks flagged, want all", p, flagged[p], total[p])
		}
	}
	share := float64(flagged[""]) / float64(total[""])
	t.Logf("people   flagged %5d of %5d (%.3f%%)", flagged[""], total[""], 100*share)
	if share > 0.01 {
		t.Errorf("%.2f%% of people's clicks flagged, want at most 1%%", 100*share)
	}
	// One verdict per click the redirect had not labelled, none for the rest.
	if want := len(clicks) - total[traffic.PatternPreview] - (total[""] - flagged[""]) -
		(total[traffic.PatternBurst] - flagged[traffic.PatternBurst]); len(verdicts) != want {
		t.Errorf("%d verdicts, want %d", len(verdicts), want)
	}

	// Every alert is in FRAUD once, and its owner sees it over the API.
	alerts := fraudIDs(t, js, "fraud.alerts.>")
	seen := 0
	for owner, key := range ownerKeys {
		var resp struct{ Alerts []events.FraudAlert }
		if code := svc.get(t, "/api/alerts?limit=1000", key, &resp); code != http.StatusOK {
			t.Fatalf("GET /api/alerts as %s: %d", owner, code)
		}
		for _, a := range resp.Alerts {
			if a.Owner != owner || alerts[a.ID] != 1 {
				t.Errorf("%s sees alert %s of %s (%d in FRAUD)", owner, a.ID, a.Owner, alerts[a.ID])
			}
			seen++
		}
	}
	if seen != len(alerts) || len(alerts) == 0 {
		t.Errorf("owners see %d alerts, FRAUD has %d", seen, len(alerts))
	}
	// The flood link's flagged share counts every click once.
	flood := traffic.Code(traffic.FloodLink)
	var st fraud.LinkStats
	if code := svc.get(t, "/api/links/"+flood+"/fraud", ownerKeys["owner"+strconv.Itoa(traffic.FloodLink%3)], &st); code != http.StatusOK {
		t.Fatalf("GET flood link stats: %d", code)
	}
	want := 0
	for _, c := range clicks {
		if c.Code == flood {
			want++
		}
	}
	if st.Total != int64(want) || st.ByRule[fraud.RuleLinkFlood] < int64(total[traffic.PatternFlood]) {
		t.Errorf("flood link stats = %+v; want total %d and at least %d flood labels", st, want, total[traffic.PatternFlood])
	}
	if got := svc.metric(t, "snip_fraud_events_judged_total"); got != float64(len(clicks)) {
		t.Errorf("snip_fraud_events_judged_total = %v, want %d (behind %v, rebuilds %v, runtime: events %v, redeliveries %v, transient errors %v, rebalances %v)",
			got, len(clicks), svc.metric(t, "snip_fraud_events_behind_total"), svc.metric(t, "snip_fraud_rebuild_events_count"),
			svc.runtimeEvents(t), svc.metric(t, `snip_reader_redeliveries_total{group="fraud-detection"}`),
			svc.metric(t, `snip_reader_handler_errors_total{group="fraud-detection",kind="transient"}`),
			svc.metric(t, `snip_reader_rebalances_total{group="fraud-detection"}`))
	}
}

// TestCrashMidBurst runs two members and crashes the one that owns the
// burst's partition after part of two bursts: visitor "a" has 15 clicks
// (under the threshold of 20), visitor "b" 25 (its alert already raised).
// The survivor takes the partition over, rebuilds the windows from the log,
// and with 10 more clicks each flags "a" (which it could not from its own
// 10) and keeps labelling "b" without raising its alert again: FRAUD holds
// exactly one alert per burst and one verdict per click.
func TestCrashMidBurst(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	rdb, db := servers.Redis.NewDB(t)
	// The topology is applied once, up front, as `snipctl topology apply`
	// would in a deployment: a stream update while the other member creates
	// consumers trips a data race inside nats-server 2.15.2 under -race.
	o := topology.Defaults()
	o.Partitions = partitions
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	members := map[string]*instance{
		"m1": start(t, n, db, "m1", "SNIP_APPLY_TOPOLOGY=false"),
		"m2": start(t, n, db, "m2", "SNIP_APPLY_TOPOLOGY=false"),
	}
	p := events.Partition("hot", partitions)
	owned := fmt.Sprintf(`snip_fraud_tracked_links{partition="%d"}`, p)
	var owner, survivor string
	// Two partitions each (bounded load: ceil(4/2)) is the final assignment.
	const ownedPartitions = `snip_reader_owned_partitions{group="fraud-detection"}`
	testenv.WaitFor(t, time.Minute, "the partitions to be shared out", func() bool {
		if members["m1"].metric(t, ownedPartitions) != 2 || members["m2"].metric(t, ownedPartitions) != 2 {
			return false
		}
		n1, n2 := members["m1"].metric(t, owned), members["m2"].metric(t, owned)
		switch {
		case n1 >= 0 && n2 < 0:
			owner, survivor = "m1", "m2"
		case n2 >= 0 && n1 < 0:
			owner, survivor = "m2", "m1"
		default:
			return false
		}
		return true
	})

	at := time.Now().Add(-30 * time.Second)
	a := traffic.Burst(at, 25, 400*time.Millisecond, "hot", "acme", "a")
	b := traffic.Burst(at.Add(100*time.Millisecond), 35, 400*time.Millisecond, "hot", "acme", "b")
	first := append(append([]traffic.Click{}, a[:15]...), b[:25]...)
	if err := traffic.Publish(t.Context(), js, first, 64); err != nil {
		t.Fatal(err)
	}
	// Crash once the owner has published and stored the first part (its
	// acks may or may not have reached the server: either way must work).
	testenv.WaitFor(t, time.Minute, "the owner to handle the first part", func() bool {
		v, _ := rdb.Get(t.Context(), fmt.Sprintf("fraud:{p%d}:hwm", p)).Uint64()
		return v >= uint64(len(first))
	})
	if got := fraudIDs(t, js, "fraud.alerts.>"); len(got) != 1 {
		t.Fatalf("before the crash: alerts %v, want b's only", got)
	}
	members[owner].crash(t)

	second := append(append([]traffic.Click{}, a[15:]...), b[25:]...)
	if err := traffic.Publish(t.Context(), js, second, 64); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "the survivor to take over and catch up", func() bool {
		return members[survivor].metric(t, owned) >= 0 && caughtUp(t, js)
	})

	alerts := fraudIDs(t, js, "fraud.alerts.>")
	wantA := fraud.AlertID(fraud.RuleVisitorBurst, "hot", "a", a[20].Time.Truncate(time.Hour))
	wantB := fraud.AlertID(fraud.RuleVisitorBurst, "hot", "b", b[20].Time.Truncate(time.Hour))
	if len(alerts) != 2 || alerts[wantA] != 1 || alerts[wantB] != 1 {
		t.Fatalf("alerts in FRAUD = %v, want %s and %s once each", alerts, wantA, wantB)
	}
	s, _ := js.Stream(t.Context(), events.FraudStream)
	info, _ := s.Info(t.Context(), jetstream.WithSubjectFilter(events.FraudAlertSubject("hot")))
	if got := info.State.Subjects[events.FraudAlertSubject("hot")]; got != 2 {
		t.Fatalf("%d alert messages on %s, want 2", got, events.FraudAlertSubject("hot"))
	}
	verdicts := fraudLabels(t, js)
	for _, c := range append(a, b...) {
		if verdicts[c.ID] != 1 {
			t.Fatalf("click %s of %s: %d verdicts, want 1", c.ID, c.Visitor, verdicts[c.ID])
		}
	}
	var st fraud.LinkStats
	if code := members[survivor].get(t, "/api/links/hot/fraud", ownerKeys["acme"], &st); code != http.StatusOK || st.Total != 60 || st.Flagged != 60 {
		t.Fatalf("link stats = %d %+v, want 60 of 60 flagged", code, st)
	}
	if got := members[survivor].metric(t, "snip_fraud_rebuild_events_count"); got < 1 {
		t.Fatalf("survivor rebuilt %v times, want at least once", got)
	}
	// The survivor remembers every click labelled, those of the rebuild
	// included (its clock is the last click's, 30 s ago: none expired).
	remembered := fmt.Sprintf(`snip_fraud_remembered_labels{partition="%d"}`, p)
	if got := members[survivor].metric(t, remembered); got != 60 {
		t.Fatalf("%s = %v on the survivor, want 60", remembered, got)
	}
}

// TestReplayRaisesNoNewAlert rewinds the group to the start: every event
// is judged again and every alert raised again, and FRAUD drops each as a
// duplicate, so its alerts (IDs and count) are unchanged.
func TestReplayRaisesNoNewAlert(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	_, db := servers.Redis.NewDB(t)
	svc := start(t, n, db, "m1")
	clicks := traffic.Generate(traffic.Spec{Seed: 9, Start: time.Now().Add(-10 * time.Minute), Duration: 6 * time.Minute, HumanRate: 5, Links: 60, Owners: 3, Inject: true})
	if err := traffic.Publish(t.Context(), js, clicks, 512); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "the group to catch up", func() bool { return caughtUp(t, js) })
	before := fraudIDs(t, js, "fraud.alerts.>")
	var statsBefore fraud.LinkStats
	flood := traffic.Code(traffic.FloodLink)
	floodKey := ownerKeys["owner"+strconv.Itoa(traffic.FloodLink%3)]
	if code := svc.get(t, "/api/links/"+flood+"/fraud", floodKey, &statsBefore); code != http.StatusOK || statsBefore.Flagged == 0 {
		t.Fatalf("flood link stats before the replay: %d %+v, want 200 with flagged clicks", code, statsBefore)
	}
	if len(before) == 0 {
		t.Fatal("no alerts to replay")
	}

	if _, err := reader.Rewind(t.Context(), js, topology.GroupFraudDetection, reader.FromSeq(1)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "the replay to be judged", func() bool {
		return svc.metric(t, "snip_fraud_events_judged_total") >= float64(2*len(clicks)) && caughtUp(t, js)
	})
	after := fraudIDs(t, js, "fraud.alerts.>")
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("alerts after the replay = %v\nbefore = %v", after, before)
	}
	if got := svc.metric(t, "snip_fraud_publish_duplicates_total"); got < float64(len(before)) {
		t.Fatalf("snip_fraud_publish_duplicates_total = %v, want at least the %d alerts raised again", got, len(before))
	}
	var statsAfter fraud.LinkStats
	if code := svc.get(t, "/api/links/"+flood+"/fraud", floodKey, &statsAfter); code != http.StatusOK {
		t.Fatalf("flood link stats after the replay: %d", code)
	}
	if fmt.Sprint(statsAfter) != fmt.Sprint(statsBefore) {
		t.Fatalf("flood link stats changed by the replay: %+v -> %+v", statsBefore, statsAfter)
	}
}

// TestARedisThatLostEverythingIsCountedAgainAfterARestart: the service
// judged the generated mix and stops; Redis loses everything (FLUSHDB) and
// the service starts again. Every partition's mark reads 0, as for a group
// never started; the origins recorded in NATS say the statistics began at
// each partition's first event. At each partition's next click the runtime
// hands the partition's events again from there: every link's statistics
// and every owner's alert list are what they were before the loss, and
// nothing is published again.
func TestARedisThatLostEverythingIsCountedAgainAfterARestart(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	rdb, db := servers.Redis.NewDB(t)
	svc := start(t, n, db, "m1")
	clicks := traffic.Generate(traffic.Spec{Seed: 11, Start: time.Now().Add(-10 * time.Minute), Duration: 6 * time.Minute, HumanRate: 5, Links: 40, Owners: 3, Inject: true})
	if err := traffic.Publish(t.Context(), js, clicks, 512); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "the group to catch up", func() bool { return caughtUp(t, js) })
	owner := map[string]string{}
	for _, c := range clicks {
		owner[c.Code] = c.Owner
	}
	// What the owners see: every link's statistics, every owner's alerts.
	seen := func(svc *instance) (map[string]fraud.LinkStats, map[string][]string) {
		stats := map[string]fraud.LinkStats{}
		for code, o := range owner {
			var st fraud.LinkStats
			if c := svc.get(t, "/api/links/"+code+"/fraud", ownerKeys[o], &st); c != http.StatusOK {
				t.Fatalf("GET stats of %s: %d", code, c)
			}
			stats[code] = st
		}
		alerts := map[string][]string{}
		for o, key := range ownerKeys {
			var resp struct{ Alerts []events.FraudAlert }
			if c := svc.get(t, "/api/alerts?limit=1000", key, &resp); c != http.StatusOK {
				t.Fatalf("GET /api/alerts as %s: %d", o, c)
			}
			for _, a := range resp.Alerts {
				alerts[o] = append(alerts[o], a.ID)
			}
		}
		return stats, alerts
	}
	statsBefore, alertsBefore := seen(svc)
	fraudBefore := fraudIDs(t, js, "fraud.alerts.>")
	if len(fraudBefore) == 0 {
		t.Fatal("no alerts raised")
	}
	svc.stop(t)

	if err := rdb.FlushDB(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	svc = start(t, n, db, "m2")
	// A click on a link of each partition: each partition's next batch.
	wake := map[int]string{}
	for i := 0; len(wake) < partitions; i++ {
		code := "wake" + strconv.Itoa(i)
		if _, ok := wake[events.Partition(code, partitions)]; !ok {
			wake[events.Partition(code, partitions)] = code
		}
	}
	for _, code := range wake {
		if err := traffic.Publish(t.Context(), js, traffic.Burst(time.Now(), 1, 0, code, "acme", "late"), 1); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 3*time.Minute, "each partition's next click judged and stored", func() bool {
		for _, code := range wake {
			if svc.get(t, "/api/links/"+code+"/fraud", ownerKeys["acme"], nil) != http.StatusOK {
				return false
			}
		}
		return caughtUp(t, js)
	})
	statsAfter, alertsAfter := seen(svc)
	if d := cmp.Diff(statsBefore, statsAfter); d != "" {
		t.Errorf("links' statistics after the loss (-before +after):\n%s", d)
	}
	if d := cmp.Diff(alertsBefore, alertsAfter); d != "" {
		t.Errorf("owners' alerts after the loss (-before +after):\n%s", d)
	}
	if d := cmp.Diff(fraudBefore, fraudIDs(t, js, "fraud.alerts.>")); d != "" {
		t.Errorf("alerts on FRAUD after the loss (-before +after):\n%s", d)
	}
	for series, want := range map[string]float64{
		"snip_fraud_store_wiped_total": partitions, "snip_fraud_store_unrecoverable_total": 0, "snip_fraud_publish_duplicates_total": 0,
	} {
		if got := svc.metric(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func TestConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		environ []string
		wantErr bool
	}{
		{name: "defaults_load"},
		{name: "start_duration", environ: []string{"FRAUD_START=72h"}},
		{name: "bad_start", environ: []string{"FRAUD_START=yesterday"}, wantErr: true},
		{name: "bad_threshold", environ: []string{"FRAUD_VISITOR_THRESHOLD=0"}, wantErr: true},
		{name: "narrow_listed_network", environ: []string{"FRAUD_LISTED_NETWORKS=203.0.113.0/28"}, wantErr: true},
		{name: "missing_networks_file", environ: []string{"FRAUD_LISTED_NETWORKS_FILE=/nonexistent"}, wantErr: true},
		{name: "zero_publish_window", environ: []string{"FRAUD_PUBLISH_WINDOW=0"}, wantErr: true},
		{name: "replica_wait", environ: []string{"FRAUD_WAIT_REPLICAS=1", "FRAUD_WAIT_REPLICAS_TIMEOUT=250ms"}},
		{name: "negative_replica_wait", environ: []string{"FRAUD_WAIT_REPLICAS=-1"}, wantErr: true},
		{name: "zero_replica_wait_timeout", environ: []string{"FRAUD_WAIT_REPLICAS=1", "FRAUD_WAIT_REPLICAS_TIMEOUT=0s"}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := loadConfig(tc.environ, nil)
			if (err != nil) != tc.wantErr {
				t.Fatalf("loadConfig(%v) = %v, want error %v", tc.environ, err, tc.wantErr)
			}
			if err == nil && cfg.HTTPAddr != ":8082" {
				t.Fatalf("HTTP_ADDR default = %q", cfg.HTTPAddr)
			}
		})
	}
	environ := []string{"NATS_PASSWORD=hunter2", "REDIS_URL=redis://u:hunter2@r:6379/0", "NATS_URL=nats://u:hunter2@n:4222"}
	cfg, err := loadConfig(environ, nil)
	if err != nil {
		t.Fatalf("loadConfig(%v) = %v, want the secrets loaded", environ, err)
	}
	if cfg.NATS.Password != "hunter2" || !strings.Contains(cfg.Redis.URL, "hunter2") || !strings.Contains(cfg.NATS.URL, "hunter2") {
		t.Fatalf("loadConfig(%v) loaded NATS_PASSWORD %q, REDIS_URL %q, NATS_URL %q: want the secrets in, or the masking check below proves nothing", environ, cfg.NATS.Password, cfg.Redis.URL, cfg.NATS.URL)
	}
	var b strings.Builder
	slog.New(slog.NewJSONHandler(&b, nil)).Info("config", "config", cfg)
	if strings.Contains(b.String(), "hunter2") {
		t.Fatalf("secret in logged config: %s", b.String())
	}
}

// The clicks every reader parks (events.ReadClick) are parked by fraud
// detection too and judged by none (no verdict can name them): a payload
// code that differs from its subject's (and hashes to another partition), a
// click dated 1999, and a subject owner that differs from the payload owner.
func TestInvalidClicksAreParkedAndNotJudged(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	_, db := servers.Redis.NewDB(t)
	svc := start(t, n, db, "m1")
	now := time.Now().UTC()
	valid := func(code string) events.Click {
		return events.Click{V: events.ClickVersion, ID: events.NewID(), Time: now, Code: code, Owner: "acme",
			Target: "https://example.com/", Visitor: "v1", UserAgent: "Mozilla/5.0"}
	}
	pub := func(subject string, c events.Click) {
		t.Helper()
		b, _ := json.Marshal(c)
		if _, err := js.Publish(t.Context(), subject, b, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
	}
	good := []events.Click{valid("link0"), valid("link1"), valid("link2")}
	for _, c := range good {
		pub(events.ClickSubject(c.Owner, c.Code), c)
	}
	mismatch := valid("link0x")
	for events.Partition(mismatch.Code, partitions) == events.Partition("link0", partitions) {
		mismatch.Code += "x"
	}
	pub(events.ClickSubject("acme", "link0"), mismatch)
	old := valid("link1")
	old.Time = time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC)
	pub(events.ClickSubject("acme", "link1"), old)
	owner := valid("link2")
	pub(events.ClickSubject("mallory", "link2"), owner)

	testenv.WaitFor(t, time.Minute, "the group to catch up", func() bool { return caughtUp(t, js) })
	if got := svc.metric(t, "snip_fraud_events_judged_total"); got != float64(len(good)) {
		t.Errorf("snip_fraud_events_judged_total = %v, want %d (the valid clicks only)", got, len(good))
	}
	if got := svc.metric(t, `snip_reader_parked_total{group="fraud-detection",reason="subject_mismatch"}`); got != 2 {
		t.Errorf("parked subject_mismatch = %v, want 2", got)
	}
	if got := svc.metric(t, `snip_reader_parked_total{group="fraud-detection",reason="implausible_time"}`); got != 1 {
		t.Errorf("parked implausible_time = %v, want 1", got)
	}
}
