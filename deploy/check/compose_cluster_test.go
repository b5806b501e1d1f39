package check

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
)

// docker-compose.cluster.yml runs the system on three NATS nodes (the
// generated deploy/nats/cluster configs: routes to all three, JetStream, a
// store of each node's own) and a Redis Cluster of six nodes that a one-shot
// forms with one replica per master. Every service is given every NATS node
// and every Redis node, streams have three replicas wherever the topology is
// applied, and each one starts only once what it needs is up: the topology
// after all three NATS nodes are healthy, the services after the topology
// and the Redis Cluster are done.
func TestComposeClusterRunsOnANATSClusterAndARedisCluster(t *testing.T) {
	const file = "docker-compose.cluster.yml"
	p := loadCompose(t, file, "loadtest")

	nats := imageServices(p, "nats")
	if len(nats) != 3 {
		t.Fatalf("%s: %d NATS nodes, want 3", file, len(nats))
	}
	var natsNames []string
	volumes := map[string]string{}
	for name, n := range nats {
		natsNames = append(natsNames, name)
		conf := filepath.Join("cluster", name+".conf")
		if i := slices.Index(n.Command, "-c"); i < 0 || i+1 >= len(n.Command) || n.Command[i+1] != "/etc/nats/"+conf {
			t.Errorf("%s: command %v, want -c /etc/nats/%s", name, n.Command, conf)
		}
		b, err := os.ReadFile(filepath.Join(root, "deploy", "nats", conf))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, want := range []string{"server_name: " + name, "jetstream {", "cluster {", "include ../accounts.conf"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("deploy/nats/%s lacks %q", conf, want)
			}
		}
		for other := range nats {
			if !strings.Contains(string(b), "nats-route://"+other+":6222") {
				t.Errorf("deploy/nats/%s has no route to %s", conf, other)
			}
		}
		mounted := false
		for _, v := range n.Volumes {
			switch v.Target {
			case "/etc/nats":
				mounted = strings.HasSuffix(v.Source, filepath.Join("deploy", "nats")) && v.ReadOnly
			case "/data":
				if prev, dup := volumes[v.Source]; dup {
					t.Errorf("%s and %s share the JetStream store %s", name, prev, v.Source)
				}
				volumes[v.Source] = name
			}
		}
		if !mounted {
			t.Errorf("%s: deploy/nats is not mounted read-only at /etc/nats", name)
		}
		if n.HealthCheck == nil || len(n.HealthCheck.Test) == 0 {
			t.Errorf("%s: no healthcheck", name)
		}
	}
	if len(volumes) != 3 {
		t.Errorf("%d JetStream stores for 3 NATS nodes", len(volumes))
	}

	redis := imageServices(p, "redis")
	if len(redis) != 6 {
		t.Fatalf("%s: %d Redis nodes, want 6", file, len(redis))
	}
	var redisNames []string
	for name, r := range redis {
		redisNames = append(redisNames, name)
		if i := slices.Index(r.Command, "--cluster-enabled"); i < 0 || r.Command[i+1] != "yes" {
			t.Errorf("%s: not in cluster mode: %v", name, r.Command)
		}
		if i := slices.Index(r.Command, "--appendonly"); i < 0 || r.Command[i+1] != "yes" {
			t.Errorf("%s: no append-only file: %v", name, r.Command)
		}
		if r.HealthCheck == nil || len(r.HealthCheck.Test) == 0 {
			t.Errorf("%s: no healthcheck", name)
		}
	}
	create, err := p.GetService("redis-cluster")
	if err != nil {
		t.Fatalf("%s: no one-shot to form the Redis Cluster: %v", file, err)
	}
	script := strings.Join(create.Command, " ")
	for _, want := range []string{"--cluster create", "--cluster-replicas 1", "cluster_state:ok"} {
		if !strings.Contains(script, want) {
			t.Errorf("redis-cluster: the script lacks %q:\n%s", want, script)
		}
	}
	if create.Restart != "no" {
		t.Errorf("redis-cluster: restart %q, want a one-shot (\"no\")", create.Restart)
	}
	needs(t, create, redisNames, types.ServiceConditionHealthy)

	topo, err := p.GetService("topology")
	if err != nil {
		t.Fatal(err)
	}
	needs(t, topo, natsNames, types.ServiceConditionHealthy)

	for name, svc := range p.Services {
		if svc.Build == nil {
			continue
		}
		env := func(k string) string {
			if v := svc.Environment[k]; v != nil {
				return *v
			}
			return ""
		}
		if v := env("NATS_URL"); v != "" {
			for _, n := range natsNames {
				if !strings.Contains(v, "nats://"+n+":4222") {
					t.Errorf("%s: NATS_URL %s lacks %s", name, v, n)
				}
			}
		}
		if v := env("REDIS_URL"); v != "" {
			if !strings.HasPrefix(v, "redis+cluster://") {
				t.Errorf("%s: REDIS_URL %s is not a redis+cluster:// URL", name, v)
			}
			for _, r := range redisNames {
				if !strings.Contains(v, r+":6379") {
					t.Errorf("%s: REDIS_URL lacks %s", name, r)
				}
			}
			if _, err := url.Parse(strings.Split(v, ",")[0]); err != nil {
				t.Errorf("%s: REDIS_URL: %v", name, err)
			}
			if name != "topology" && svc.Restart != "no" && len(svc.Profiles) == 0 {
				needs(t, svc, []string{"redis-cluster"}, types.ServiceConditionCompletedSuccessfully)
			}
		}
		// A service that applies the topology with one replica would try
		// to shrink every stream: each one that reads SNIP_REPLICAS gets 3.
		dir := "services/" + *svc.Build.Args["SERVICE"]
		if d := svc.Build.Args["DIR"]; d != nil {
			dir = *d
		}
		if slices.Contains(envTags(t, filepath.Join(root, dir)), "SNIP_REPLICAS") && env("SNIP_REPLICAS") != "3" {
			t.Errorf("%s: SNIP_REPLICAS %q, want 3", name, env("SNIP_REPLICAS"))
		}
		if name != "topology" && svc.Restart != "no" && len(svc.Profiles) == 0 {
			needs(t, svc, []string{"topology"}, types.ServiceConditionCompletedSuccessfully)
		}
	}
}

// needs checks that svc starts only once each of names meets condition.
func needs(t *testing.T, svc types.ServiceConfig, names []string, condition string) {
	t.Helper()
	for _, n := range names {
		d, ok := svc.DependsOn[n]
		if !ok {
			t.Errorf("%s does not depend on %s", svc.Name, n)
			continue
		}
		if d.Condition != condition {
			t.Errorf("%s starts when %s is %q, want %q", svc.Name, n, d.Condition, condition)
		}
	}
}

// Every `docker compose` command docker-compose.cluster.yml's comments give
// names the file (-f docker-compose.cluster.yml): without it, docker compose
// acts on docker-compose.yml's project instead.
func TestComposeClusterCommentsNameTheirFile(t *testing.T) {
	const file = "docker-compose.cluster.yml"
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	// The comments' text, a command wrapped over two lines joined again.
	var text strings.Builder
	for line := range strings.Lines(string(b)) {
		if _, comment, ok := strings.Cut(line, "#"); ok {
			text.WriteString(strings.TrimSpace(comment) + " ")
		}
	}
	commands := regexp.MustCompile("`(docker compose [^`]*)`").FindAllStringSubmatch(text.String(), -1)
	if len(commands) < 3 {
		t.Fatalf("found %d docker compose commands in %s's comments: %q", len(commands), file, commands)
	}
	for _, c := range commands {
		if !strings.Contains(c[1], "-f "+file) {
			t.Errorf("%s's comments give `%s`, which runs docker-compose.yml's project: add -f %s", file, c[1], file)
		}
	}
}
