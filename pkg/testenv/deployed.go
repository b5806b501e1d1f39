package testenv

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DeployedPassword is the password every user of StartDeployedNATS has:
// "pw-" and the user's name.
func DeployedPassword(user string) string { return "pw-" + user }

// StartDeployedNATS runs nats-server with the deployment's configuration
// (conf: the path of deploy/nats/nats.conf, which includes accounts.conf
// beside it) on a free loopback port, JetStream in a temporary folder, and
// returns its client URL. Every user's password is DeployedPassword(user).
// So a test runs a service as the least-privilege user it is deployed as.
//
// The configuration reads the passwords from environment variables, which
// this sets (t.Setenv): the calling test cannot be parallel.
func StartDeployedNATS(t *testing.T, conf string) string {
	t.Helper()
	accounts, err := os.ReadFile(filepath.Join(filepath.Dir(conf), "accounts.conf"))
	if err != nil {
		t.Fatalf("deployed NATS users: %v", err)
	}
	for _, v := range regexp.MustCompile(`\$SNIP_NATS_([A-Z]+)_PASSWORD`).FindAllStringSubmatch(string(accounts), -1) {
		t.Setenv("SNIP_NATS_"+v[1]+"_PASSWORD", DeployedPassword(strings.ToLower(v[1])))
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("deployed NATS configuration %s: %v", conf, err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = filepath.Join(t.TempDir(), "js")
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("deployed NATS: %v", err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatalf("nats-server with %s not ready within 10s", conf)
	}
	return ns.ClientURL()
}
