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

// StartNATSWithConfig runs an embedded nats-server with the configuration
// file conf (deploy/nats/nats.conf: its users and their permissions) on a
// free port of 127.0.0.1, its JetStream store under t.TempDir(), and shuts
// it down when the test ends. It returns the client URL.
//
// Every $SNIP_NATS_<USER>_PASSWORD the files next to conf name is set to
// "pw-<user>" (lower case) in the environment, where the server reads it;
// so the test may not be parallel (t.Setenv).
func StartNATSWithConfig(t *testing.T, conf string) string {
	t.Helper()
	vars := regexp.MustCompile(`\$SNIP_NATS_([A-Z0-9_]+)_PASSWORD`)
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(conf), "*.conf"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		for _, v := range vars.FindAllStringSubmatch(string(b), -1) {
			t.Setenv("SNIP_NATS_"+v[1]+"_PASSWORD", "pw-"+strings.ToLower(v[1]))
		}
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("testenv: nats config %s: %v", conf, err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = filepath.Join(t.TempDir(), "jetstream")
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("testenv: nats: %v", err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatalf("testenv: nats-server with %s not ready after 20s", conf)
	}
	return ns.ClientURL()
}
