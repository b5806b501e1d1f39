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

// The redirect service does its whole job as the least-privilege "redirect"
// user of deploy/nats: the relay publishes clicks, link events and preview
// jobs on its own inbox prefix, and the LINKS follower (an ordered consumer
// of its own) sees a deletion: a second instance, which has the link
// cached for a minute and learns of the deletion only from LINKS, stops
// redirecting it. (The deleting instance drops the link from its own cache
// at once, so it says nothing about the follower.)
func TestRedirectWorksAsTheDeployedNATSUser(t *testing.T) {
	url := testenv.StartNATSWithConfig(t, filepath.Join("..", "..", "deploy", "nats", "nats.conf"))
	nc, err := nats.Connect(url, nats.UserInfo("admin", "pw-admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	admin, _ := jetstream.New(nc)
	_, db := servers.Redis.NewDB(t)
	cfg := testConfig(servers.Redis.URL(db), url)
	cfg.NATS.User, cfg.NATS.Password = "redirect", "pw-redirect"
	if err := topology.Apply(t.Context(), admin, cfg.Topology.Options()); err != nil { // snipctl topology apply
		t.Fatal(err)
	}
	in := startInstance(t, cfg)
	other := startInstance(t, cfg)
	code := createLink(t, in.URL, "https://example.com/as-redirect", "")
	for _, base := range []string{in.URL, in.URL, other.URL} { // other caches the link
		if r := do(t, "GET", base+"/"+code, ""); r.Status != http.StatusFound {
			t.Fatalf("redirect: %d", r.Status)
		}
	}
	// The follower reads from "new" on: it must be following before the delete.
	testenv.WaitFor(t, 30*time.Second, "the other instance following LINKS as the redirect user", func() bool {
		return metric(t, other.URL, "snip_redirect_links_following") == 1
	})
	if r := do(t, "DELETE", in.URL+"/api/links/"+code, "", "Authorization", "Bearer "+acmeKey); r.Status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	testenv.WaitFor(t, 30*time.Second, "3 clicks, 2 link events and a job relayed as the redirect user", func() bool {
		return streamCount(admin, events.ClicksStream) == 3 && streamCount(admin, events.LinksStream) == 2 &&
			streamCount(admin, events.PreviewJobsStream) == 1
	})
	if r := do(t, "GET", in.URL+"/"+code, ""); r.Status != http.StatusNotFound {
		t.Fatalf("GET via the deleting instance = %d, want 404", r.Status)
	}
	testenv.WaitFor(t, 30*time.Second, "the other instance to stop redirecting the deleted link (told by LINKS)", func() bool {
		return do(t, "GET", other.URL+"/"+code, "").Status == http.StatusNotFound
	})
}
