package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/service/servicetest"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A graceful stop finishes and acks what it holds: afterwards no partition
// has events in flight and every ack floor is at the partition's last event.
func TestGracefulStopAcksEverything(t *testing.T) {
	t.Parallel()
	s, svc, _ := countedSystem(t, 8, 25)
	svc.stop(t)
	stream, err := s.js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	for p := range testPartitions {
		c, err := stream.Consumer(t.Context(), topology.GroupConsumerName(topology.GroupClickCounter, p))
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		last, err := stream.GetLastMsgForSubject(t.Context(), events.PartitionFilter(p))
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending != 0 || info.AckFloor.Stream != last.Sequence {
			t.Errorf("partition %d after stop: %d in flight, ack floor %d; want 0 and %d", p, info.NumAckPending, info.AckFloor.Stream, last.Sequence)
		}
	}
}

// /readyz reports Redis: down when it is down, back when it is back.
func TestReadyzFollowsRedis(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	r := testenv.StartRedis(t)
	s := &system{nats: n, js: n.JetStream(t), redisURL: "redis://" + r.Addr + "/0"}
	svc := s.start(t, "m1", nil)
	ready := func() int {
		resp, err := http.Get("http://" + svc.addr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testenv.WaitFor(t, 20*time.Second, "ready", func() bool { return ready() == http.StatusOK })
	r.Pause()
	testenv.WaitFor(t, 20*time.Second, "not ready while Redis is frozen", func() bool { return ready() == http.StatusServiceUnavailable })
	r.Resume()
	testenv.WaitFor(t, 20*time.Second, "ready again", func() bool { return ready() == http.StatusOK })
}

// A member started while NATS is down answers on HTTP_ADDR at once:
// /healthz 200 (a liveness probe leaves it be), /readyz 503 saying it
// waits to apply the topology, the API 503 "starting". Once NATS is up it
// serves the API on the same address and turns ready.
func TestStartsAnsweringWhileNATSIsDown(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.nats.Stop() // its port is kept: Start brings it back there
	cfg := s.testConfig("m1")
	routes := make(chan string, 1)
	cfg.Ready = func(a string) { routes <- a }
	log := slog.New(slog.NewJSONHandler(testWriter{t}, nil))
	svc := servicetest.Start(t, func(ctx context.Context, listening func(string)) error {
		cfg.Listening = listening
		return run(ctx, log, cfg)
	})
	get := func(path string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, svc.URL()+path, nil)
		req.Header.Set("Authorization", "Bearer "+acmeKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with NATS down at start = %d %s, want 200", code, body)
	}
	var code int
	var body string
	if !testenv.Poll(20*time.Second, func() bool { // setup enters the wait a moment after the bind
		code, body = get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"starting"`) &&
			strings.Contains(body, `"waiting_for":"apply topology"`) && strings.Contains(body, `"nats clickcounter":"nats `)
	}) {
		t.Errorf("/readyz with NATS down at start = %d %s, want 503 starting, waiting to apply the topology, NATS down", code, body)
	}
	if code, body := get("/api/links/x/stats"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"starting"`) {
		t.Errorf("the API with NATS down at start = %d %s, want 503 starting", code, body)
	}

	s.nats.Start()
	select {
	case a := <-routes:
		if a != svc.Addr {
			t.Errorf("the API served at %s, want where it listened from the start, %s", a, svc.Addr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the API not served 60s after NATS came up")
	}
	testenv.WaitFor(t, 30*time.Second, "ready", func() bool { code, _ := get("/readyz"); return code == http.StatusOK })
	if _, ok := statsOf(t, svc.Addr, "x"); ok {
		t.Error("stats of a link nobody clicked")
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     []string
		wantErr string
		check   func(Config) string
	}{
		{name: "defaults", check: func(c Config) string {
			return cmp.Diff([]any{":8081", 2000, 100 * time.Millisecond, 10 * time.Minute, 8, 168 * time.Hour, 0},
				[]any{c.HTTPAddr, c.BatchSize, c.Linger, c.DedupWindow, c.Partitions, c.ClicksMaxAge, c.WaitReplicas})
		}},
		{name: "overrides", env: []string{"CLICKCOUNTER_BATCH_SIZE=50", "CLICKCOUNTER_DEDUP_WINDOW=30m", "LOG_LEVEL=debug"},
			check: func(c Config) string {
				return cmp.Diff([]any{50, 30 * time.Minute, "DEBUG"}, []any{c.BatchSize, c.DedupWindow, c.LogLevel.String()})
			}},
		{name: "replica_wait", env: []string{"CLICKCOUNTER_WAIT_REPLICAS=1", "CLICKCOUNTER_WAIT_REPLICAS_TIMEOUT=250ms"},
			check: func(c Config) string {
				return cmp.Diff([]any{1, 250 * time.Millisecond}, []any{c.WaitReplicas, c.WaitReplicasTimeout})
			}},
		{name: "replica_wait_negative", env: []string{"CLICKCOUNTER_WAIT_REPLICAS=-1"}, wantErr: "CLICKCOUNTER_WAIT_REPLICAS"},
		{name: "replica_wait_timeout_zero", env: []string{"CLICKCOUNTER_WAIT_REPLICAS=1", "CLICKCOUNTER_WAIT_REPLICAS_TIMEOUT=0s"}, wantErr: "CLICKCOUNTER_WAIT_REPLICAS_TIMEOUT"},
		{name: "batch_size_zero", env: []string{"CLICKCOUNTER_BATCH_SIZE=0"}, wantErr: "CLICKCOUNTER_BATCH_SIZE"},
		{name: "dedup_window_too_short", env: []string{"CLICKCOUNTER_DEDUP_WINDOW=10ms"}, wantErr: "CLICKCOUNTER_DEDUP_WINDOW"},
		{name: "bad_duration", env: []string{"CLICKCOUNTER_LINGER=soon"}, wantErr: "CLICKCOUNTER_LINGER"},
		{name: "bad_log_level", env: []string{"LOG_LEVEL=loud"}, wantErr: "LOG_LEVEL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := loadConfig(tc.env, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("loadConfig error = %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := tc.check(c); d != "" {
				t.Fatalf("config (-want +got):\n%s", d)
			}
		})
	}
}

// The configuration is logged with its secrets masked.
func TestConfigLogMasksSecrets(t *testing.T) {
	t.Parallel()
	c, err := loadConfig([]string{"NATS_PASSWORD=hunter2", "REDIS_URL=redis://u:s3cret@h:6379/0", "SNIP_BOOTSTRAP_OWNERS=acme:snip_key"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := c.LogValue().String()
	for _, secret := range []string{"hunter2", "s3cret", "snip_key"} {
		if strings.Contains(out, secret) {
			t.Errorf("logged config contains %q: %s", secret, out)
		}
	}
}

// A partition count that contradicts the existing CLICKS stream stops the
// service at start with the reason, instead of retrying forever.
func TestDifferentPartitionCountStopsTheService(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	first := s.start(t, "m1", nil)
	first.stop(t)
	ready := make(chan string, 1)
	cfg := s.testConfig("")
	cfg.Partitions, cfg.ShutdownTimeout, cfg.BootstrapOwners = testPartitions+1, time.Second, ""
	cfg.Ready = func(addr string) { ready <- addr }
	err := run(t.Context(), slog.New(slog.DiscardHandler), cfg)
	if !errors.Is(err, topology.ErrPartitionsChanged) {
		t.Fatalf("run = %v, want %v", err, topology.ErrPartitionsChanged)
	}
}
