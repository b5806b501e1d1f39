package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
)

// hammer clicks codes from workers concurrent clients, each sending its
// next request when the last is answered, until stop is closed.
func hammer(l *ledger, base string, codes []string, workers int, stop <-chan struct{}) (wait func()) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := l.click(base, codes[i%len(codes)]); err != nil {
					time.Sleep(20 * time.Millisecond) // the server is away; do not spin
				}
			}
		})
	}
	return wg.Wait
}

// lostClicks counts the clicks that got a 302 and are not in CLICKS. It
// fails the test if a click is in CLICKS twice (by event ID or request ID)
// or under a Nats-Msg-Id other than its event ID.
func (l *ledger) lostClicks(tb testing.TB, clicks []clickMsg) int {
	tb.Helper()
	seenEvent, seenReq := map[string]bool{}, map[string]bool{}
	for _, c := range clicks {
		if c.MsgID != c.Click.ID {
			tb.Fatalf("Nats-Msg-Id %q != event ID %q", c.MsgID, c.Click.ID)
		}
		if seenEvent[c.Click.ID] || seenReq[c.Click.RequestID] {
			tb.Fatalf("click %s (request %s) is in CLICKS twice", c.Click.ID, c.Click.RequestID)
		}
		seenEvent[c.Click.ID], seenReq[c.Click.RequestID] = true, true
	}
	return l.missingServed(clicks)
}

// TestGuarantee_ReplicaWaitShortPublishesTheClickOnceAndStillAnswers302 runs
// the redirect with SNIP_OUTBOX_WAIT_REPLICAS=1 on a Redis without replicas,
// so every group commit's WAIT falls short (and every link creation's). Each click is then published
// straight to CLICKS as well as stored in the outbox, and the relay's later
// publish of the same entry (same Nats-Msg-Id) is dropped by the stream:
// every click is in CLICKS exactly once. With NATS stopped too, the click
// stays on the (only) master: the redirect still answers 302, counts it as
// master_only, and the relay publishes it once NATS is back.
func TestGuarantee_ReplicaWaitShortPublishesTheClickOnceAndStillAnswers302(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(servers.Redis.URL(db), n.URL)
	cfg.OutboxWaitReplicas, cfg.OutboxWaitReplicasTimeout = 1, 5*time.Millisecond
	in := startInstance(t, cfg)
	l := newLedger()
	var codes []string
	for i := range 4 {
		codes = append(codes, createLink(t, in.URL, fmt.Sprintf("https://example.com/w%d", i), ""))
	}
	// Link creations wait too, fall short the same way, and are answered 201.
	if got := metric(t, in.URL, "snip_redirect_writes_replica_wait_short_total", `op="create_link"`); got != 4 {
		t.Fatalf("writes_replica_wait_short_total{op=create_link} = %v, want the 4 links created", got)
	}
	// So do an API key's rotation's writes: the new key stored, the old one
	// revoked; the key is rotated all the same.
	if r := do(t, "POST", in.URL+"/api/key/rotate", "", "Authorization", "Bearer "+acmeKey); r.Status != http.StatusCreated {
		t.Fatalf("rotate key: %d %s", r.Status, r.Body)
	}
	for _, op := range []string{"store_key", "revoke_key"} {
		if got := metric(t, in.URL, "snip_redirect_writes_replica_wait_short_total", `op="`+op+`"`); got != 1 {
			t.Fatalf("writes_replica_wait_short_total{op=%s} = %v, want 1", op, got)
		}
	}
	stop := make(chan struct{})
	close(stop)
	drive(l, func() string { return in.URL }, codes, 25, stop)()
	if l.refused != 0 {
		t.Fatalf("%d redirects were not 302: %q", l.refused, l.why)
	}
	served := l.total()
	// Every click: backed up after its WAIT fell short, or, where the whole
	// outbox write took longer than SNIP_OUTBOX_WAIT (a loaded machine),
	// recorded straight in JetStream instead.
	published := metric(t, in.URL, "snip_redirect_clicks_replica_wait_short_total", `outcome="published"`)
	direct := metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="jetstream"`)
	if published == 0 || int(published+direct) != served {
		t.Fatalf("clicks_replica_wait_short_total{published} = %v and %v recorded straight in JetStream, want every click (%d), most of them backed up",
			published, direct, served)
	}
	// The relay publishes every outbox entry too: JetStream acks them as
	// duplicates, and the outbox empties.
	testenv.WaitFor(t, 60*time.Second, "the relay to empty the outbox", func() bool {
		return metric(t, in.URL, "snip_redirect_relay_published_total", `lane="clicks"`) >= float64(served) &&
			metricIs(t, in.URL, "snip_redirect_outbox_depth_total_entries", 0, `lane="clicks"`)
	})
	js := n.JetStream(t)
	if _, errored := l.expectInCLICKSAnyOrder(t, js); errored != 0 {
		t.Fatalf("%d requests answered with an error", errored)
	}

	n.Stop()
	drive(l, func() string { return in.URL }, codes, 5, stop)()
	if l.refused != 0 {
		t.Fatalf("NATS down: %d redirects were not 302: %q", l.refused, l.why)
	}
	if got := metric(t, in.URL, "snip_redirect_clicks_replica_wait_short_total", `outcome="master_only"`); got != 20 {
		t.Fatalf("clicks_replica_wait_short_total{master_only} = %v, want the 20 clicks sent while NATS was down", got)
	}
	n.Start()
	served, _ = l.expectInCLICKSAnyOrder(t, js)
	t.Logf("%d clicks served, each in CLICKS once: the direct publish first, the relay's copy dropped as a duplicate; 20 of them with NATS down, relayed later", served)
}

// TestGuarantee_RedisMasterKilledAfterItsReplicaWasCutOff measures what the
// replica wait buys on a real Redis Cluster (three masters, a replica each,
// as processes). Clicks go to links whose outbox shard is on one master.
// Its replica is cut off (SIGSTOP, then the master drops the replication
// link, so nothing written from then on reaches it) and the redirect goes
// on acknowledging clicks; then the master is SIGKILLed, the replica
// resumed, promoted by the cluster, and traffic goes on. The relay of that
// master's shards is held back meanwhile (their leases held by a hung
// instance, as when a relay is behind), so the clicks are still only in the
// outbox when the master dies. Then every acknowledged click is looked for
// in CLICKS:
//
//   - SNIP_OUTBOX_WAIT_REPLICAS=0: every click acknowledged after the cut
//     is lost with the master (asserted: more than 0, and logged);
//   - SNIP_OUTBOX_WAIT_REPLICAS=1: none is lost, because each WAIT fell short
//     and the redirect published those clicks straight to CLICKS.
func TestGuarantee_RedisMasterKilledAfterItsReplicaWasCutOff(t *testing.T) {
	for _, replicas := range []int{0, 1} {
		t.Run(fmt.Sprintf("wait_replicas=%d", replicas), func(t *testing.T) {
			lost, cut, short, direct := killMasterWithReplicaCutOff(t, replicas)
			t.Logf("SNIP_OUTBOX_WAIT_REPLICAS=%d: %d clicks acknowledged after the replica was cut off; %d acknowledged clicks lost; %v clicks whose replica wait fell short (also published straight to CLICKS); %v recorded straight in JetStream only (the outbox not answering within SNIP_OUTBOX_WAIT: queued behind waiting batches, or the master dead)",
				replicas, cut, lost, short, direct)
			switch {
			case replicas == 0 && lost == 0:
				t.Fatalf("no click lost without the replica wait: the test did not cut the replica off")
			case replicas > 0 && lost != 0:
				t.Fatalf("%d acknowledged clicks lost with SNIP_OUTBOX_WAIT_REPLICAS=%d", lost, replicas)
			case replicas > 0 && short == 0:
				t.Fatalf("no click took the replica-wait fallback: the replica was not cut off")
			}
		})
	}
}

// killMasterWithReplicaCutOff runs the scenario and returns the clicks lost,
// the clicks acknowledged between the cut and the kill, the clicks whose
// replica wait fell short and were published, and those recorded straight
// in JetStream alone.
func killMasterWithReplicaCutOff(t *testing.T, replicas int) (lost, cut int, short, direct float64) {
	rc := testenv.StartRedisCluster(t)
	n := testenv.StartNATS(t)
	rdb := rc.Client(t)
	ctx := t.Context()
	cfg := testConfig(rc.URL(), n.URL)
	cfg.OutboxWaitReplicas, cfg.OutboxWaitReplicasTimeout = replicas, 50*time.Millisecond
	layout := outbox.NewLayout(cfg.OutboxShards)

	victim, err := rc.MasterOf(ctx, layout.LeaseKey(0))
	if err != nil {
		t.Fatal(err)
	}
	var replica *testenv.RedisServer
	for i, m := range rc.Masters {
		if m == victim {
			replica = rc.Replicas[i]
		}
	}
	var victimShards []int
	for s := range layout.Shards {
		if m, err := rc.MasterOf(ctx, layout.LeaseKey(s)); err != nil {
			t.Fatal(err)
		} else if m == victim {
			victimShards = append(victimShards, s)
		}
	}
	// A hung instance holds the victim's shards: the relay leaves them alone.
	for _, s := range victimShards {
		if err := rdb.Set(ctx, layout.LeaseKey(s), "hung-instance", 10*time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}

	in := startInstance(t, cfg)
	var codes []string
	for i := 0; len(codes) < 6; i++ {
		code := fmt.Sprintf("cut%04d", i)
		for _, s := range victimShards {
			if layout.Shard(code) == s {
				codes = append(codes, createLink(t, in.URL, "https://example.com/"+code, code))
			}
		}
	}
	l := newLedger()
	for _, code := range codes { // warm the link cache: no lookups on the dead master later
		if got, err := l.click(in.URL, code); got != http.StatusFound {
			t.Fatalf("GET /%s = %d %v", code, got, err)
		}
	}
	stop := make(chan struct{})
	wait := hammer(l, in.URL, codes, 8, stop)
	testenv.WaitFor(t, 30*time.Second, "200 clicks before the cut", func() bool { return l.total() >= 200 })

	// Cut the replica off: frozen, it cannot reconnect, and the master drops
	// the link (what it had sent already is the replica's; nothing after).
	replica.Pause()
	master := redis.NewClient(&redis.Options{Addr: victim.Addr})
	defer master.Close()
	if err := master.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the master to have no replica", func() bool {
		info, err := master.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:0")
	})
	atCut := l.total()
	testenv.WaitFor(t, 30*time.Second, "300 clicks acknowledged after the cut", func() bool { return l.total() >= atCut+300 })
	atKill := l.total()
	victim.Kill()
	replica.Resume()
	testenv.WaitFor(t, 60*time.Second, "the replica to be promoted", func() bool {
		m, err := rc.MasterOf(ctx, layout.LeaseKey(victimShards[0]))
		return err == nil && m == replica
	})
	// Traffic goes on until the outbox takes the victim's clicks again.
	viaOutbox := metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="outbox"`)
	testenv.WaitFor(t, 60*time.Second, "clicks in the outbox after the failover", func() bool {
		return metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="outbox"`) >= viaOutbox+100
	})
	close(stop)
	wait()

	// The hung instance's leases go; the relay publishes what the promoted
	// replica has.
	for _, s := range victimShards {
		if err := rdb.Del(ctx, layout.LeaseKey(s)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 60*time.Second, "the relay to empty the outbox", func() bool {
		for s := range layout.Shards {
			if n, err := rdb.XLen(ctx, layout.OutboxKey(s, outbox.LaneClicks)).Result(); err != nil || n > 0 {
				return false
			}
		}
		return true
	})
	short = metric(t, in.URL, "snip_redirect_clicks_replica_wait_short_total", `outcome="published"`)
	direct = metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="jetstream"`)
	return l.lostClicks(t, readClicks(t, n.JetStream(t))), atKill - atCut, short, direct
}

// The replica wait is off by default; when on, its timeout must leave room
// inside SNIP_OUTBOX_WAIT.
func TestConfigReplicaWait(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OutboxWaitReplicas != 0 || cfg.OutboxWaitReplicasTimeout != 50*time.Millisecond {
		t.Fatalf("defaults: %d replicas, %s; want 0 (off), 50ms", cfg.OutboxWaitReplicas, cfg.OutboxWaitReplicasTimeout)
	}
	cfg, err = loadConfig([]string{"SNIP_OUTBOX_WAIT_REPLICAS=1", "SNIP_OUTBOX_WAIT_REPLICAS_TIMEOUT=20ms"}, nil)
	if err != nil || cfg.OutboxWaitReplicas != 1 || cfg.OutboxWaitReplicasTimeout != 20*time.Millisecond {
		t.Fatalf("WAIT 1 20ms: %+v, %v", cfg.OutboxWaitReplicas, err)
	}
	for _, env := range [][]string{
		{"SNIP_OUTBOX_WAIT_REPLICAS=-1"},
		{"SNIP_OUTBOX_WAIT_REPLICAS=1", "SNIP_OUTBOX_WAIT_REPLICAS_TIMEOUT=100ms"}, // = SNIP_OUTBOX_WAIT
		{"SNIP_OUTBOX_WAIT_REPLICAS=1", "SNIP_OUTBOX_WAIT_REPLICAS_TIMEOUT=0s"},
	} {
		if _, err := loadConfig(env, nil); err == nil {
			t.Errorf("%v accepted", env)
		}
	}
}

// BenchmarkReplicaWait measures what SNIP_OUTBOX_WAIT_REPLICAS=1 costs a
// redirect on a Redis Cluster (three masters with a replica each, processes
// on loopback): two instances on the same cluster and NATS, one with the
// wait off and one with WAIT 1 (50 ms timeout), take open-loop traffic at
// SNIP_BENCH_RATE (default 500/s) on cached links in alternating phases of
// 5 s, three each; the 302 latency per setting, all phases together. Run it
// once:
//
//	go test -run '^$' -bench ReplicaWait -benchtime 1x .
func BenchmarkReplicaWait(b *testing.B) {
	rate := envInt("SNIP_BENCH_RATE", 500)
	rc := testenv.StartRedisCluster(b)
	n := testenv.StartNATS(b)
	rc.Client(b) // flushes
	off, on := testConfig(rc.URL(), n.URL), testConfig(rc.URL(), n.URL)
	off.Instance, on.Instance = "wait-off", "wait-on"
	on.OutboxWaitReplicas, on.OutboxWaitReplicasTimeout = 1, 50*time.Millisecond
	instances := map[string]*instance{"off": startInstance(b, off), "on": startInstance(b, on)}
	l := newLedger()
	var codes []string
	for i := range 50 {
		code := createLink(b, instances["off"].URL, fmt.Sprintf("https://example.com/r%d", i), "")
		codes = append(codes, code)
		for _, in := range instances {
			if got, err := l.click(in.URL, code); got != http.StatusFound {
				b.Fatalf("GET = %d %v", got, err)
			}
		}
	}
	lat := map[string][]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for round := range 3 {
			for _, name := range []string{"off", "on"} {
				stop := make(chan struct{})
				l.takeLatencies()
				wait := openLoop(l, instances[name].URL, codes, rate, stop)
				time.Sleep(5 * time.Second) // a measured phase of fixed length, not a wait for a condition
				close(stop)
				wait()
				got := l.takeLatencies()
				p50, p99, _ := percentiles(got)
				b.Logf("round %d, wait %-3s %6d 302s  p50 %8s  p99 %8s", round+1, name, len(got), p50.Round(time.Microsecond), p99.Round(time.Microsecond))
				lat[name] = append(lat[name], got...)
			}
		}
	}
	b.StopTimer()
	for _, name := range []string{"off", "on"} {
		p50, p99, top := percentiles(lat[name])
		b.Logf("SNIP_OUTBOX_WAIT_REPLICAS %-3s %6d 302s  p50 %8s  p99 %8s  max %8s", name, len(lat[name]),
			p50.Round(time.Microsecond), p99.Round(time.Microsecond), top.Round(time.Microsecond))
	}
	served, errored := l.expectInCLICKSAnyOrder(b, n.JetStream(b))
	b.Logf("%d clicks served, %d refused (%d with an error status); replica wait fell short for %v (published) + %v (master only); lost 0, doubled 0 (checked)",
		served, l.refused, errored,
		metric(b, instances["on"].URL, "snip_redirect_clicks_replica_wait_short_total", `outcome="published"`),
		metric(b, instances["on"].URL, "snip_redirect_clicks_replica_wait_short_total", `outcome="master_only"`))
}
