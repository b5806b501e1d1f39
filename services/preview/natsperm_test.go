package main

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// The preview workers do their whole job as the least-privilege "preview"
// user of deploy/nats: pull jobs on their own inbox prefix, ack, store a
// preview, park a job that ran out of tries, and park one whose worker
// crashed on the last try from its MAX_DELIVERIES advisory on
// PREVIEW_ADVISORIES (pull and ack the advisory, copy the job by sequence,
// delete it).
func TestPreviewWorksAsTheDeployedNATSUser(t *testing.T) {
	url := testenv.StartNATSWithConfig(t, filepath.Join("..", "..", "deploy", "nats", "nats.conf"))
	nc, err := nats.Connect(url, nats.UserInfo("admin", "pw-admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	admin, _ := jetstream.New(nc)
	// snipctl topology apply, as admin; short retry steps so five tries end
	// quickly.
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(t.Context(), admin, o); err != nil {
		t.Fatal(err)
	}
	cc := topology.PreviewConsumerConfig()
	cc.BackOff = []time.Duration{300 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 600 * time.Millisecond}
	cc.AckWait = cc.BackOff[0]
	if _, err := admin.CreateOrUpdateConsumer(t.Context(), "PREVIEW_JOBS", cc); err != nil {
		t.Fatal(err)
	}
	rdb, db := servers.Redis.NewDB(t)
	w := &world{js: admin, natsURL: url, rdb: rdb, redisURL: servers.Redis.URL(db), pages: newPageServer(t, "127.0.0.1:0")}
	w.pages.handle("/good", html("good"))
	w.pages.handle("/broken", func(rw http.ResponseWriter, _ *http.Request) {
		http.Error(rw, "database on fire", http.StatusInternalServerError)
	})
	crashed(t, admin, w.pages.URL+"/good")
	start(t, w.config(t, "NATS_USER=preview", "NATS_PASSWORD=pw-preview"))
	publishJob(t, admin, "good", w.pages.URL+"/good")
	publishJob(t, admin, "broken", w.pages.URL+"/broken")
	testenv.WaitFor(t, 30*time.Second, "the good page's preview stored", func() bool { return previewHash(t, rdb, "good")["status"] == "ok" })
	testenv.WaitFor(t, 30*time.Second, "the broken and the crashed jobs parked", func() bool { return len(letters(t, admin)) == 2 })
	testenv.WaitFor(t, 10*time.Second, "the queue empty", func() bool { return streamMsgs(t, admin, "PREVIEW_JOBS") == 0 })
	testenv.WaitFor(t, 10*time.Second, "the advisory acked", func() bool { return streamMsgs(t, admin, events.PreviewAdvisoriesStream) == 0 })
	if h := previewHash(t, rdb, "crashed"); h["status"] != "failed" || h["reason"] != "max_deliveries" {
		t.Fatalf("crashed job's preview = %v, want failed with reason max_deliveries", h)
	}
}

// crashed queues a job and takes all its deliveries without deciding, as
// workers that crash would, then waits in a pull until the server gives up
// on it and announces it: the advisory waits on PREVIEW_ADVISORIES.
func crashed(t *testing.T, admin jetstream.JetStream, target string) {
	t.Helper()
	publishJob(t, admin, "crashed", target)
	cons, err := admin.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	for range topology.PreviewMaxDeliver {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := <-b.Messages(); !ok {
			t.Fatalf("no delivery: %v", b.Error())
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the advisory kept", func() bool {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for range b.Messages() {
			t.Fatal("a delivery after MaxDeliver")
		}
		return streamMsgs(t, admin, events.PreviewAdvisoriesStream) == 1
	})
}
