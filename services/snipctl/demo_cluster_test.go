package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// `snipctl demo --cluster` runs every service on a 3-node NATS cluster and a
// Redis Cluster: each service answers its health check, a click goes from
// the redirect to the counter; the NATS node that leads CLICKS is killed
// with kill -9 as the banner tells a user to, the demo says so and goes on,
// and the next click is counted; SIGUSR1 starts the node again and a third
// click is counted; then the Redis master holding the link's counter keys
// is killed, and the fourth click is counted once its replica has taken
// over.
//
// Not parallel: it runs sixteen processes, and it sends the test binary
// SIGUSR1, which the cluster demo handles.
func TestDemoClusterGoesOnWhenANodeDies(t *testing.T) {
	bin := allDemoBinaries(t)
	var dir string
	var base int
	d := startDemo(t, []string{"SNIP_PARTITIONS=2"}, func() []string {
		dir = t.TempDir()
		var args []string
		args, base, _, _ = demoArgs(t, bin, dir)
		return append(args, "--cluster")
	})
	out := d.out
	t.Cleanup(func() {
		d.cancel()
		select {
		case err := <-d.done:
			if err != nil {
				t.Errorf("demo returned %v\n%s", err, out.String())
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("demo did not stop\n%s", out.String())
		}
	})
	testenv.WaitFor(t, 2*time.Minute, "the banner", func() bool {
		return strings.Contains(out.String(), "kill -USR1 ") || strings.Contains(out.String(), "snip demo stopped")
	})
	banner := out.String()
	if !strings.Contains(banner, "Snip is ") || !strings.Contains(banner, "kill -STOP PID") {
		t.Fatalf("no cluster banner:\n%s", banner)
	}

	// Every service answers its health check.
	health := &http.Client{Timeout: 5 * time.Second}
	for _, s := range demoServices {
		url := "http://127.0.0.1:" + strconv.Itoa(base+s.port) + "/healthz"
		deadline := time.Now().Add(time.Minute)
		for httpOK(t.Context(), health, url) != nil {
			if time.Now().After(deadline) {
				log, _ := os.ReadFile(filepath.Join(dir, "logs", s.name+".log"))
				t.Fatalf("%s: no answer on %s in a minute: %v\ndemo output:\n%s\nthe end of %s.log:\n%s",
					s.name, url, httpOK(t.Context(), health, url), out.String(), s.name, tail(log, 4000))
			}
			time.Sleep(50 * time.Millisecond) // polling, with the deadline above
		}
	}
	// The banner lists three NATS nodes and six Redis nodes with their PIDs.
	natsPIDs := map[string]int{}
	for _, m := range regexp.MustCompile(`nats (n\d) +pid (\d+) +client (nats://\S+)`).FindAllStringSubmatch(banner, -1) {
		natsPIDs[m[1]], _ = strconv.Atoi(m[2])
	}
	if len(natsPIDs) != 3 {
		t.Fatalf("the banner lists %d NATS nodes, want 3:\n%s", len(natsPIDs), banner)
	}
	if n := len(regexp.MustCompile(`redis +pid \d+ +127\.0\.0\.1:\d+ (master|replica)`).FindAllString(banner, -1)); n != 6 {
		t.Fatalf("the banner lists %d Redis nodes, want 6:\n%s", n, banner)
	}
	natsURL := regexp.MustCompile(`nats +(nats://\S+) \(3 nodes, streams with 3 replicas\)`).FindStringSubmatch(banner)
	if natsURL == nil {
		t.Fatalf("no cluster NATS URL in:\n%s", banner)
	}

	redirect := "http://127.0.0.1:" + strconv.Itoa(base)
	counter := "http://127.0.0.1:" + strconv.Itoa(base+1)
	client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	click := func() {
		t.Helper()
		testenv.WaitFor(t, time.Minute, "a 302 from the redirect", func() bool {
			resp, err := client.Get(redirect + "/nats-jetstream")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusFound
		})
	}
	click()
	testenv.WaitFor(t, time.Minute, "the click in the counter's stats", func() bool { return counted(client, counter, "nats-jetstream") >= 1 })

	// CLICKS has three replicas; kill the node that leads it.
	nc, err := nats.Connect(natsURL[1])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	info := st.CachedInfo()
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("CLICKS: %d replicas, cluster %+v; want 3 replicas", info.Config.Replicas, info.Cluster)
	}
	leader := info.Cluster.Leader
	pid := natsPIDs[leader]
	if pid == 0 {
		t.Fatalf("CLICKS leader %q is not in the banner:\n%s", leader, banner)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill nats %s (pid %d): %v", leader, pid, err)
	}
	testenv.WaitFor(t, 30*time.Second, "the demo to say the node is down", func() bool {
		return regexp.MustCompile(`nats ` + leader + ` +DOWN \(pid ` + strconv.Itoa(pid) + `\)`).MatchString(out.String())
	})
	click()
	testenv.WaitFor(t, time.Minute, "the click sent with a NATS node dead, counted", func() bool {
		return counted(client, counter, "nats-jetstream") == 2
	})

	// SIGUSR1 starts the node again, with its store; a third click counts.
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the demo to restart the node", func() bool {
		return regexp.MustCompile(`nats ` + leader + ` +restarted \(pid \d+\)`).MatchString(out.String())
	})
	click()
	testenv.WaitFor(t, time.Minute, "the third click counted", func() bool { return counted(client, counter, "nats-jetstream") == 3 })

	// Now a Redis master: the one holding the link's counter keys, so the
	// counter must write the next click to the replica promoted in its
	// place. The demo says so, and the fourth click is counted.
	master, mpid := redisMasterOf(t, banner, "nats-jetstream")
	killed := time.Now()
	if err := syscall.Kill(mpid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill redis %s (pid %d): %v", master, mpid, err)
	}
	testenv.WaitFor(t, 30*time.Second, "the demo to say the Redis master is down", func() bool {
		return regexp.MustCompile(`redis ` + regexp.QuoteMeta(master) + ` +DOWN \(pid ` + strconv.Itoa(mpid) + `\)`).MatchString(out.String())
	})
	click()
	testenv.WaitFor(t, time.Minute, "the click sent with a Redis master dead, counted", func() bool {
		return counted(client, counter, "nats-jetstream") == 4
	})
	if n := counted(client, counter, "nats-jetstream"); n != 4 {
		t.Errorf("counter shows %d clicks, want the 4 sent\n%s", n, out.String())
	}
	t.Logf("redis master %s killed; the fourth click redirected and counted %s after the kill", master, time.Since(killed).Round(time.Millisecond))
}

// redisMasterOf returns the address and PID of the Redis master (from the
// demo's banner) that holds the counter's all-time counts of a link
// (cc:{p<N>}:g<G>:l:<owner>:<code>, see the counter's README).
func redisMasterOf(t *testing.T, banner, code string) (string, int) {
	t.Helper()
	for _, m := range regexp.MustCompile(`redis +pid (\d+) +(127\.0\.0\.1:\d+) master`).FindAllStringSubmatch(banner, -1) {
		rdb := redis.NewClient(&redis.Options{Addr: m[2]})
		found := false
		iter := rdb.Scan(t.Context(), 0, "cc:*:"+code, 1000).Iterator()
		for iter.Next(t.Context()) {
			found = found || strings.Contains(iter.Val(), ":l:")
		}
		err := iter.Err()
		rdb.Close()
		if err != nil {
			t.Fatalf("scan %s: %v", m[2], err)
		}
		if found {
			pid, _ := strconv.Atoi(m[1])
			return m[2], pid
		}
	}
	t.Fatalf("no Redis master holds the counter's counts of %q:\n%s", code, banner)
	return "", 0
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// The banner's "who leads each stream" line names each stream with its
// leader: it printed every stream's leader without the stream's name
// (grep -A3 '"cluster"' began below the name), so a user could not tell
// which node leads CLICKS, the one to kill.
func TestTheClusterBannersLeadersCommandNamesEachStreamsLeader(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	o := topology.Defaults()
	o.Replicas = 3
	js := c.JetStream(t)
	c.ApplyTopology(t, js, o)
	st, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("CLICKS has no leader: %+v", info.Cluster)
	}
	cmd := leadersCommand(c.Nodes[0].Monitor)
	out, err := exec.CommandContext(t.Context(), "bash", "-c", cmd).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	// grep separates the streams with "--".
	var leader string
	for _, block := range strings.Split(string(out), "\n--\n") {
		if strings.Contains(block, `"name": "`+events.ClicksStream+`"`) {
			if m := regexp.MustCompile(`"leader": "(n\d)"`).FindStringSubmatch(block); m != nil {
				leader = m[1]
			}
		}
	}
	if leader != info.Cluster.Leader {
		t.Fatalf("%s\nprinted:\n%s\nwant CLICKS named with its leader, %s (found %q)", cmd, out, info.Cluster.Leader, leader)
	}
}
