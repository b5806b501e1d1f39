package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	if v := os.Getenv(verdictEnv); v != "" {
		mainWithVerdict(v) // a child of TestScenarioRunExitStatus
	}
	if os.Getenv(signalChild) != "" {
		mainThatHangs() // a child of TestSecondSignalEndsAStopThatHangs
	}
	code := testenv.Main(m, &servers, testenv.WithRedis())
	for _, dir := range []string{built.dir, allBuilt.dir} {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

func snipctl(t *testing.T, environ []string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(t.Context(), args, environ, &out, &out, slog.New(slog.DiscardHandler))
	return out.String(), err
}

func TestTopologyApply(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	environ := []string{"NATS_URL=" + n.URL, "SNIP_PARTITIONS=6"}
	var out string
	for range 2 { // idempotent
		var err error
		if out, err = snipctl(t, environ, "topology", "apply"); err != nil {
			t.Fatalf("topology apply: %v\n%s", err, out)
		}
	}
	js := n.JetStream(t)
	got, err := topology.Partitions(context.Background(), js)
	if err != nil || got != 6 {
		t.Fatalf("partitions = %d, %v; want 6", got, err)
	}
	if _, err := js.Stream(t.Context(), events.DeadLetterStream); err != nil {
		t.Fatalf("DEAD_LETTER: %v", err)
	}
	if _, err := js.Consumer(t.Context(), events.PreviewAdvisoriesStream, topology.PreviewRescueConsumer); err != nil {
		t.Fatalf("%s > %s: %v", events.PreviewAdvisoriesStream, topology.PreviewRescueConsumer, err)
	}
	for _, want := range []string{"stream " + events.PreviewAdvisoriesStream + " ok", "bucket " + topology.MembersBucket + " ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("topology apply says\n%s\nwithout %q", out, want)
		}
	}
	// Every consumer it declares is there and said, with its stream: the
	// output lists what the operator now has, not a part of it.
	for _, c := range []struct{ stream, durable string }{
		{events.PreviewJobsStream, topology.PreviewConsumer},
		{events.PreviewAdvisoriesStream, topology.PreviewRescueConsumer},
		{events.LinksStream, topology.ClickCounterLinksConsumerConfig().Durable},
		{events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumer},
		{events.FraudStream, topology.WebhooksAlertsConsumerConfig().Durable},
	} {
		if _, err := js.Consumer(t.Context(), c.stream, c.durable); err != nil {
			t.Errorf("%s > %s: %v", c.stream, c.durable, err)
		}
		if !regexp.MustCompile(`consumer ` + regexp.QuoteMeta(c.durable) + ` +ok \(on ` + c.stream + `\)`).MatchString(out) {
			t.Errorf("topology apply says\n%s\nwithout consumer %s on %s", out, c.durable, c.stream)
		}
	}
}

// `topology apply` that fails partway (a consumer it cannot update in
// place) has said each stream and consumer it applied before the failure,
// and none after it.
func TestTopologyApplyThatFailsPartwaySaysWhatItApplied(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	environ := []string{"NATS_URL=" + n.URL}
	if out, err := snipctl(t, environ, "topology", "apply"); err != nil {
		t.Fatalf("topology apply: %v\n%s", err, out)
	}
	js := n.JetStream(t)
	// The counter's LINKS consumer as another ack policy made it: refused.
	cfg := topology.ClickCounterLinksConsumerConfig()
	if err := js.DeleteConsumer(t.Context(), events.LinksStream, cfg.Durable); err != nil {
		t.Fatal(err)
	}
	cfg.AckPolicy = jetstream.AckAllPolicy
	if _, err := js.CreateConsumer(t.Context(), events.LinksStream, cfg); err != nil {
		t.Fatal(err)
	}
	out, err := snipctl(t, environ, "topology", "apply")
	if !errors.Is(err, topology.ErrConsumerImmutable) {
		t.Fatalf("topology apply over a consumer of another ack policy: %v\n%s, want ErrConsumerImmutable", err, out)
	}
	for _, s := range topology.Streams(topology.Defaults()) {
		if !regexp.MustCompile(`(?m)^stream ` + s.Name + ` +ok$`).MatchString(out) {
			t.Errorf("topology apply that failed at a consumer says\n%s\nwithout stream %s, applied before it", out, s.Name)
		}
	}
	before := true
	for _, c := range topology.Consumers() {
		if c.Config.Durable == cfg.Durable {
			before = false
		}
		said := regexp.MustCompile(`(?m)^consumer ` + regexp.QuoteMeta(c.Config.Durable) + ` +ok \(on ` + c.Stream + `\)$`).MatchString(out)
		if said != before {
			t.Errorf("topology apply that failed at consumer %s says\n%s\nconsumer %s on %s said ok: %v, want %v (applied before the failure)",
				cfg.Durable, out, c.Config.Durable, c.Stream, said, before)
		}
	}
	if strings.Contains(out, "bucket ") {
		t.Errorf("topology apply that failed at a consumer says\n%s\nwith the bucket ok, applied after it", out)
	}
}

// `topology apply` with a shorter SNIP_CLICKS_MAX_AGE than CLICKS has is
// refused, exits 1, says how to mean it and prints no "ok"; with
// --shrink-retention it shrinks CLICKS.
func TestTopologyApplyShrinksRetentionOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	long := []string{"NATS_URL=" + n.URL, "SNIP_CLICKS_MAX_AGE=720h"}
	if out, err := snipctl(t, long, "topology", "apply"); err != nil {
		t.Fatalf("topology apply: %v\n%s", err, out)
	}
	short := []string{"NATS_URL=" + n.URL, "SNIP_CLICKS_MAX_AGE=168h"}
	out, err := snipctl(t, short, "topology", "apply")
	if !errors.Is(err, topology.ErrRetentionShrinks) || exitStatus(err) != 1 || !strings.Contains(err.Error(), "--shrink-retention") || strings.Contains(out, " ok") {
		t.Fatalf("topology apply of a shorter age: err %v (exit %d), output\n%s\nwant ErrRetentionShrinks naming --shrink-retention, exit 1, no ok", err, exitStatus(err), out)
	}
	maxAge := func() time.Duration {
		t.Helper()
		s, err := n.JetStream(t).Stream(t.Context(), events.ClicksStream)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.MaxAge
	}
	if got := maxAge(); got != 720*time.Hour {
		t.Fatalf("CLICKS max age %s after the refused apply, want 720h", got)
	}
	if out, err := snipctl(t, short, "topology", "apply", "--shrink-retention"); err != nil {
		t.Fatalf("topology apply --shrink-retention: %v\n%s", err, out)
	}
	if got := maxAge(); got != 168*time.Hour {
		t.Fatalf("CLICKS max age %s after apply --shrink-retention, want 168h", got)
	}
	if _, err := snipctl(t, short, "topology", "apply", "--shrink"); !errors.Is(err, errUsage) {
		t.Fatalf("topology apply --shrink: %v, want a usage error", err)
	}
}

// `topology apply` with fewer SNIP_REPLICAS than the streams have on a
// cluster is refused and exits 1 naming --lower-replicas; with
// --lower-replicas it scales them down.
func TestTopologyApplyLowersReplicasOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	o := topology.Defaults()
	o.Replicas = 3
	c.ApplyTopology(t, c.JetStream(t), o)
	one := []string{"NATS_URL=" + c.URL, "SNIP_REPLICAS=1"}
	out, err := snipctl(t, one, "topology", "apply")
	if !errors.Is(err, topology.ErrReplicasLowered) || exitStatus(err) != 1 || !strings.Contains(err.Error(), "--lower-replicas") || strings.Contains(out, " ok") {
		t.Fatalf("topology apply of fewer replicas: err %v (exit %d), output\n%s\nwant ErrReplicasLowered naming --lower-replicas, exit 1, no ok", err, exitStatus(err), out)
	}
	replicas := func() int {
		t.Helper()
		s, err := c.JetStream(t).Stream(t.Context(), events.ClicksStream)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.Replicas
	}
	if got := replicas(); got != 3 {
		t.Fatalf("CLICKS has %d replicas after the refused apply, want 3", got)
	}
	if out, err := snipctl(t, one, "topology", "apply", "--lower-replicas"); err != nil {
		t.Fatalf("topology apply --lower-replicas: %v\n%s", err, out)
	}
	if got := replicas(); got != 1 {
		t.Fatalf("CLICKS has %d replicas after apply --lower-replicas, want 1", got)
	}
}

func TestOwnersCreatePrintsWorkingKey(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	environ := []string{"REDIS_URL=" + servers.Redis.URL(db)}
	out, err := snipctl(t, environ, "owners", "create", "acme", "-name", "Acme")
	if err != nil {
		t.Fatalf("owners create: %v\n%s", err, out)
	}
	key := regexp.MustCompile(`api key: (\S+)`).FindStringSubmatch(out)
	if key == nil {
		t.Fatalf("no api key in output:\n%s", out)
	}
	o, err := owners.NewStore(rdb).Authenticate(t.Context(), key[1])
	if err != nil || o.ID != "acme" || o.Name != "Acme" {
		t.Fatalf("printed key authenticates as %+v, %v", o, err)
	}
	if _, err := snipctl(t, environ, "owners", "create", "acme"); !errors.Is(err, owners.ErrExists) {
		t.Fatalf("second create err = %v, want ErrExists", err)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := [][]string{{"nope"}, {"topology"}, {"topology", "drop"}, {"owners", "create"}}
	for i, args := range tests {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			if _, err := snipctl(t, nil, args...); !errors.Is(err, errUsage) {
				t.Fatalf("snipctl %v: err = %v, want a usage error", args, err)
			}
		})
	}
}

// With NATS unreachable each command that uses it fails at once with
// the connection's own error ("no servers available"), not after
// SNIPCTL_TIMEOUT with "context deadline exceeded": an operator learns
// that NATS is not there, not that something was slow.
func TestNATSCommandsFailAtOnceWithoutNATS(t *testing.T) {
	t.Parallel()
	// Port 1: nothing listens there, and no test's server can take it.
	environ := []string{"NATS_URL=nats://127.0.0.1:1", "SNIPCTL_TIMEOUT=3s"}
	for _, args := range [][]string{{"topology", "apply"}, {"lag"}, {"dlq", "list"}, {"replay", "warehouse-loader", "--from-seq", "1"}} {
		t.Run(strings.Join(args, "_"), func(t *testing.T) {
			t.Parallel()
			out, err := snipctl(t, environ, args...)
			if !errors.Is(err, nats.ErrNoServers) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("snipctl %v without NATS: err = %v, want nats.ErrNoServers at once\n%s", args, err, out)
			}
		})
	}
}

// A SNIPCTL_TIMEOUT of zero or less would end every call at once ("context
// deadline exceeded", after the command had begun): it is refused up
// front, naming the variable, and nothing is written.
func TestConfigRefusesATimeoutOfNothing(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	for _, timeout := range []string{"0s", "-1s"} {
		environ := []string{"REDIS_URL=" + servers.Redis.URL(db), "SNIPCTL_TIMEOUT=" + timeout}
		out, err := snipctl(t, environ, "owners", "create", "acme")
		if err == nil || !strings.Contains(err.Error(), "SNIPCTL_TIMEOUT") {
			t.Errorf("SNIPCTL_TIMEOUT=%s: err = %v, want one naming SNIPCTL_TIMEOUT\n%s", timeout, err, out)
		}
	}
	if n, err := rdb.DBSize(t.Context()).Result(); err != nil || n != 0 {
		t.Errorf("Redis holds %d keys (err %v), want none", n, err)
	}
}

// A command that reads Snip's streams, pointed at a NATS without them (the
// wrong server or account, or one nothing has applied the topology to),
// fails saying what to check and what creates them, not only the server's
// "stream not found".
func TestStreamCommandsWithoutTheTopologySayWhatToDo(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	environ := []string{"NATS_URL=" + n.URL, "SNIPCTL_TIMEOUT=10s"}
	for _, args := range [][]string{{"lag"}, {"lag", "warehouse-loader"}, {"dlq", "list"}, {"dlq", "show", "1"}, {"dlq", "redrive", "--all"}, {"replay", "warehouse-loader", "--from-seq", "1"}} {
		out, err := snipctl(t, environ, args...)
		if err == nil || exitStatus(err) != 1 || !strings.Contains(err.Error(), "snipctl topology apply") || !strings.Contains(err.Error(), "NATS_URL") {
			t.Errorf("snipctl %v without the topology: err = %v, want exit status 1 naming NATS_URL and snipctl topology apply\n%s", args, err, out)
		}
	}
}

// `snipctl help` names every flag a command takes, or where they are
// listed (demo -h), and SNIPCTL_TIMEOUT, which bounds a replay's --wait
// and a redrive: a flag the README documents is in the help too.
func TestHelpNamesTheFlags(t *testing.T) {
	t.Parallel()
	out, err := snipctl(t, nil, "help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--shrink-retention] [--lower-replicas]", "-name NAME", "-wait-replicas N", "--from-seq N", "--wait", "--force",
		"--source S", "--reason R", "--all", "--speed X", "--json", "--cluster", "demo -h lists every flag", "SNIPCTL_TIMEOUT"} {
		if !strings.Contains(out, want) {
			t.Errorf("snipctl help does not name %q:\n%s", want, out)
		}
	}
}

// snipctl with no arguments names its settings and points to where they
// are documented: every file its usage says to see, read from the
// repository root (where the demo runs it), documents each setting named.
func TestUsagePointsWhereTheSettingsAreDocumented(t *testing.T) {
	t.Parallel()
	out, err := snipctl(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	settings := []string{"NATS_URL", "REDIS_URL", "SNIP_PARTITIONS", "SNIPCTL_TIMEOUT"}
	for _, s := range settings {
		if !strings.Contains(out, s) {
			t.Errorf("usage does not name %s:\n%s", s, out)
		}
	}
	seen := regexp.MustCompile(`see ([\w./-]+\.md)`).FindAllStringSubmatch(out, -1)
	if len(seen) == 0 {
		t.Fatalf("usage points to no document:\n%s", out)
	}
	for _, m := range seen {
		doc, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(m[1])))
		if err != nil {
			t.Errorf("usage says to see %s: %v", m[1], err)
			continue
		}
		for _, s := range settings {
			if !strings.Contains(string(doc), "`"+s+"`") {
				t.Errorf("usage says to see %s for the settings, which does not document %s", m[1], s)
			}
		}
	}
}

// On a NATS where JetStream does not answer (a server without it, or an
// account without it) every command that calls it says so, naming
// NATS_URL and the user, not only "no responders available for request".
func TestNATSCommandsWithoutJetStreamSaySo(t *testing.T) {
	t.Parallel()
	o := testenv.NATSOptions(server.RANDOM_PORT, t.TempDir())
	o.JetStream = false
	srv, err := testenv.RunNATSServer(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	environ := []string{"NATS_URL=" + srv.ClientURL(), "SNIPCTL_TIMEOUT=10s"}
	for _, args := range [][]string{{"topology", "apply"}, {"lag"}, {"dlq", "list"}, {"replay", "warehouse-loader", "--from-seq", "1"}} {
		out, err := snipctl(t, environ, args...)
		if err == nil || !strings.Contains(err.Error(), "JetStream does not answer on NATS_URL") || !strings.Contains(err.Error(), "NATS_USER") {
			t.Errorf("snipctl %v without JetStream: err = %v, want one saying JetStream does not answer on NATS_URL\n%s", args, err, out)
		}
	}
}

// A usage error of topology apply or owners names what was wrong (the
// flag it does not know, the word it does not take, the value it refuses),
// not only the usage.
func TestUsageErrorsNameWhatWasWrong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"topology", "apply", "--force"}, "-force"},
		{[]string{"topology", "apply", "now"}, `"now"`},
		{[]string{"owners", "create", "acme", "-nmae", "Acme"}, "-nmae"},
		{[]string{"owners", "rotate", "acme", "beta"}, `"beta"`},
		{[]string{"owners", "revoke", "acme", "-wait-replicas", "-1"}, "-wait-replicas -1"},
	} {
		_, err := snipctl(t, nil, tc.args...)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("snipctl %v: err = %v, want a usage error naming %s", tc.args, err, tc.says)
		}
	}
}
