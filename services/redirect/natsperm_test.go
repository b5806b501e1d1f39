package main

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// startDeployedNATS runs nats-server with deploy/nats/nats.conf on a free
// port; every user's password is "pw-<user>". It sets environment variables
// (the configuration reads passwords from them), so its test is not parallel.
func startDeployedNATS(t *testing.T) string {
	t.Helper()
	conf := filepath.Join("..", "..", "deploy", "nats", "nats.conf")
	accounts, err := os.ReadFile(filepath.Join(filepath.Dir(conf), "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range regexp.MustCompile(`\$SNIP_NATS_([A-Z]+)_PASSWORD`).FindAllStringSubmatch(string(accounts), -1) {
		t.Setenv("SNIP_NATS_"+v[1]+"_PASSWORD", "pw-"+strings.ToLower(v[1]))
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = filepath.Join(t.TempDir(), "js")
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server with deploy/nats/nats.conf not ready")
	}
	return ns.ClientURL()
}

// The redirect service does its whole job as the least-privilege "redirect"
// user of deploy/nats: the relay publishes clicks, link events and preview
// jobs on its own inbox prefix, and the LINKS follower (an ordered consumer
// of its own) sees a deletion.
func TestRedirectWorksAsTheDeployedNATSUser(t *testing.T) {
	url := startDeployedNATS(t)
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
	code := createLink(t, in.URL, "https://example.com/as-redirect", "")
	for range 3 {
		if r := do(t, "GET", in.URL+"/"+code, ""); r.Status != http.StatusFound {
			t.Fatalf("redirect: %d", r.Status)
		}
	}
	if r := do(t, "DELETE", in.URL+"/api/links/"+code, "", "Authorization", "Bearer "+acmeKey); r.Status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	testenv.WaitFor(t, 30*time.Second, "3 clicks, 2 link events and a job relayed as the redirect user", func() bool {
		return streamCount(admin, events.ClicksStream) == 3 && streamCount(admin, events.LinksStream) == 2 &&
			streamCount(admin, events.PreviewJobsStream) == 1
	})
	testenv.WaitFor(t, 30*time.Second, "the deleted link gone", func() bool {
		return do(t, "GET", in.URL+"/"+code, "").Status == http.StatusNotFound
	})
}
