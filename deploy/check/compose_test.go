package check

import (
	"context"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/snipdev/snip/pkg/topology"
)

// composeFiles are the compose files every compose check runs on: one NATS
// server and one Redis, and the same system on a NATS cluster and a Redis
// Cluster.
var composeFiles = []string{"docker-compose.yml", "docker-compose.cluster.yml"}

// eachCompose runs check as a subtest on each compose file.
func eachCompose(t *testing.T, check func(t *testing.T, file string)) {
	for _, f := range composeFiles {
		t.Run(f, func(t *testing.T) { check(t, f) })
	}
}

// loadCompose loads a compose file the way `docker compose` does: schema
// validation, interpolation of ${VAR:-default}, anchors and merges. The
// environment is the .env an operator writes (CONSOLE_TOKEN has no
// default).
func loadCompose(t *testing.T, file string, profiles ...string) *types.Project {
	t.Helper()
	p, err := loadComposeWith(file, []string{"CONSOLE_TOKEN=" + composeTestToken}, profiles...)
	if err != nil {
		t.Fatalf("%s does not load: %v", file, err)
	}
	return p
}

const composeTestToken = "compose-check-token-0123456789"

func loadComposeWith(file string, env []string, profiles ...string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, file)},
		cli.WithWorkingDirectory(root), cli.WithName("snip"), cli.WithProfiles(profiles), cli.WithEnv(env))
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(context.Background())
}

// Without CONSOLE_TOKEN compose refuses to start, naming it: no published
// development token reaches a deployment.
func TestComposeNeedsAConsoleToken(t *testing.T) {
	eachCompose(t, func(t *testing.T, file string) {
		_, err := loadComposeWith(file, nil)
		if err == nil || !strings.Contains(err.Error(), "CONSOLE_TOKEN") {
			t.Fatalf("%s without CONSOLE_TOKEN: %v, want an error naming CONSOLE_TOKEN", file, err)
		}
		p := loadCompose(t, file)
		c, err := p.GetService("console")
		if err != nil {
			t.Fatal(err)
		}
		if v := c.Environment["CONSOLE_TOKEN"]; v == nil || *v != composeTestToken {
			t.Errorf("console's CONSOLE_TOKEN is %v, want the one from the environment", v)
		}
	})
}

// imageServices are the services of p that run an image named name
// ("nats", "redis"), by service name; a one-shot (restart "no") is left out.
func imageServices(p *types.Project, name string) map[string]types.ServiceConfig {
	out := map[string]types.ServiceConfig{}
	for n, svc := range p.Services {
		if strings.HasPrefix(svc.Image, name+":") && svc.Restart != "no" {
			out[n] = svc
		}
	}
	return out
}

// Only the product is published on every interface: the redirect service
// and the console. Everything else (NATS, Redis, ClickHouse, the other
// services' APIs, Prometheus, Grafana) is bound to the host's 127.0.0.1.
// Redis needs a password, and every service's REDIS_URL carries it.
func TestComposeExposesOnlyTheProductAndRedisNeedsAPassword(t *testing.T) {
	eachCompose(t, exposesOnlyTheProductAndRedisNeedsAPassword)
}

func exposesOnlyTheProductAndRedisNeedsAPassword(t *testing.T, file string) {
	p := loadCompose(t, file, "loadtest")
	public := []string{"redirect", "console"}
	for name, svc := range p.Services {
		for _, pp := range svc.Ports {
			if slices.Contains(public, name) {
				continue
			}
			if pp.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes port %s on %q, want 127.0.0.1", name, pp.Published, pp.HostIP)
			}
		}
	}
	redises := imageServices(p, "redis")
	if len(redises) == 0 {
		t.Fatalf("%s runs no redis", file)
	}
	password := ""
	for name, redis := range redises {
		i := slices.Index(redis.Command, "--requirepass")
		if i < 0 || i+1 >= len(redis.Command) || redis.Command[i+1] == "" {
			t.Fatalf("%s runs without --requirepass: %v", name, redis.Command)
		}
		if password == "" {
			password = redis.Command[i+1]
		}
		if redis.Command[i+1] != password {
			t.Errorf("%s has another password than the other Redis nodes", name)
		}
		// Keys Snip relies on must never be evicted (docs/durability.md).
		if k := slices.Index(redis.Command, "--maxmemory-policy"); k < 0 || k+1 >= len(redis.Command) || redis.Command[k+1] != "noeviction" {
			t.Errorf("%s: not --maxmemory-policy noeviction: %v", name, redis.Command)
		}
		if j := slices.Index(redis.Command, "--cluster-enabled"); j >= 0 {
			// A replica authenticates to its master with masterauth.
			if k := slices.Index(redis.Command, "--masterauth"); k < 0 || k+1 >= len(redis.Command) || redis.Command[k+1] != password {
				t.Errorf("%s: a cluster node without --masterauth set to the password: %v", name, redis.Command)
			}
		}
		if v := redis.Environment["REDISCLI_AUTH"]; v == nil || *v != password {
			t.Errorf("%s healthcheck: REDISCLI_AUTH does not hold the password", name)
		}
	}
	users := 0
	for name, svc := range p.Services {
		v := svc.Environment["REDIS_URL"]
		if v == nil {
			continue
		}
		users++
		u, err := url.Parse(strings.Split(*v, ",")[0])
		if err != nil {
			t.Errorf("%s: REDIS_URL: %v", name, err)
			continue
		}
		if pw, _ := u.User.Password(); pw != password {
			t.Errorf("%s: REDIS_URL %s does not carry redis's password", name, u.Redacted())
		}
	}
	if users < 5 {
		t.Errorf("only %d services with a REDIS_URL", users)
	}
}

// envTags reads the environment variable names a Go module's config
// declares (caarlos0/env struct tags), or that it reads with os.Getenv,
// and those of the pkg/service blocks its Config embeds (service.NATS, ...).
func envTags(t *testing.T, dir string) []string {
	t.Helper()
	re := regexp.MustCompile(`env:"([A-Z0-9_]+)"|Getenv\("([A-Z0-9_]+)"\)|LookupEnv\("([A-Z0-9_]+)"\)`)
	embedded := regexp.MustCompile(`(?m)^\tservice\.([A-Z][A-Za-z]*)$`)
	var names []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			names = append(names, m[1]+m[2]+m[3])
		}
		for _, m := range embedded.FindAllStringSubmatch(string(b), -1) {
			block := serviceBlock(t, m[1])
			for _, m := range re.FindAllStringSubmatch(block, -1) {
				names = append(names, m[1]+m[2]+m[3])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// serviceBlock is the declaration of the configuration block
// "type name struct {...}" in pkg/service.
func serviceBlock(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "pkg", "service", "config.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\ntype "+name+" struct {")
	if !ok {
		t.Fatalf("pkg/service has no block %s", name)
	}
	block, _, _ := strings.Cut(rest, "\n}")
	return block
}

// Every Snip service in docker-compose.yml is built from the one Dockerfile
// with a SERVICE that exists, is given only environment variables its code
// reads and the servers' addresses it reads, connects to NATS as a user of
// deploy/nats with the password the NATS server is given, and has a
// healthcheck if it is long-running.
func TestComposeMatchesTheCode(t *testing.T) {
	eachCompose(t, matchesTheCode)
}

func matchesTheCode(t *testing.T, file string) {
	p := loadCompose(t, file, "loadtest")
	users := map[string]User{}
	for _, u := range Users(topology.DefaultPartitions) {
		users[u.Name] = u
	}
	natsNodes := imageServices(p, "nats")
	if len(natsNodes) == 0 {
		t.Fatalf("%s runs no nats", file)
	}
	// Every node is compared with the first by name: the same passwords,
	// and no variable one of them lacks.
	names := slices.Sorted(maps.Keys(natsNodes))
	first, natsSvc := names[0], natsNodes[names[0]]
	for _, name := range names {
		n := natsNodes[name]
		for _, u := range users {
			if v := n.Environment[u.PasswordVar]; v == nil || *v == "" {
				t.Errorf("%s lacks %s, which deploy/nats/accounts.conf reads", name, u.PasswordVar)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(natsSvc.Environment)) {
			if v, w := n.Environment[k], natsSvc.Environment[k]; v == nil || w == nil || *v != *w {
				t.Errorf("%s: %s differs from %s's", name, k, first)
			}
		}
		for k := range n.Environment {
			if _, ok := natsSvc.Environment[k]; !ok {
				t.Errorf("%s: %s, which %s is not given", name, k, first)
			}
		}
	}
	snip := 0
	for name, svc := range p.Services {
		if svc.Build == nil {
			continue
		}
		snip++
		if !strings.HasSuffix(svc.Build.Dockerfile, "deploy/docker/Dockerfile") {
			t.Errorf("%s: built from %q, want deploy/docker/Dockerfile", name, svc.Build.Dockerfile)
		}
		arg := svc.Build.Args["SERVICE"]
		if arg == nil {
			t.Errorf("%s: no SERVICE build argument", name)
			continue
		}
		dir := "services/" + *arg
		if d := svc.Build.Args["DIR"]; d != nil {
			dir = *d
		}
		if _, err := os.Stat(filepath.Join(root, dir, "go.mod")); err != nil {
			t.Errorf("%s: build folder %s is not a module: %v", name, dir, err)
			continue
		}
		known := envTags(t, filepath.Join(root, dir))
		for k := range svc.Environment {
			if !slices.Contains(known, k) {
				t.Errorf("%s: environment variable %s is not read by %s (it reads %v)", name, k, dir, known)
			}
		}
		if user := svc.Environment["NATS_USER"]; user != nil {
			u, ok := users[*user]
			if !ok {
				t.Errorf("%s: NATS_USER %q is not a user in deploy/nats", name, *user)
			} else if pw, np := svc.Environment["NATS_PASSWORD"], natsSvc.Environment[u.PasswordVar]; pw == nil || np == nil || *pw != *np {
				t.Errorf("%s: NATS_PASSWORD does not match the nats service's %s", name, u.PasswordVar)
			}
		}
		oneShot := svc.Restart == "no" || len(svc.Profiles) > 0
		// The servers' addresses default to 127.0.0.1, which in a
		// container is the service itself: a long-running service that
		// reads one is given it.
		for _, k := range []string{"NATS_URL", "REDIS_URL", "CLICKHOUSE_ADDR"} {
			if !oneShot && slices.Contains(known, k) && svc.Environment[k] == nil {
				t.Errorf("%s: %s reads %s, and compose does not set it", name, dir, k)
			}
		}
		if !oneShot && (svc.HealthCheck == nil || len(svc.HealthCheck.Test) == 0) {
			t.Errorf("%s: a long-running service without a healthcheck", name)
		}
		if addr := svc.Environment["HTTP_ADDR"]; addr != nil && !oneShot {
			_, port, _ := net.SplitHostPort(*addr)
			exposed := false
			for _, pp := range svc.Ports {
				exposed = exposed || pp.Target == parsePort(port)
			}
			if !exposed {
				t.Errorf("%s: listens on %s but does not publish that port", name, *addr)
			}
		}
	}
	if snip < 7 {
		t.Errorf("only %d Snip services in %s", snip, file)
	}
	for _, dir := range []string{"redirect", "clickcounter", "fraud", "warehouse", "preview", "console", "webhooks"} {
		if _, err := p.GetService(dir); err != nil {
			t.Errorf("%s has no %s service", file, dir)
		}
	}
}

func parsePort(s string) uint32 {
	var n uint32
	for _, c := range s {
		n = n*10 + uint32(c-'0')
	}
	return n
}

// The Dockerfile parses, takes SERVICE, and copies pkg next to the service
// so `replace ../../pkg` resolves inside the build.
func TestDockerfile(t *testing.T) {
	f, err := os.Open(filepath.Join(root, "deploy/docker/Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("Dockerfile does not parse: %v", err)
	}
	var args, copies []string
	stages := 0
	for _, n := range res.AST.Children {
		switch strings.ToLower(n.Value) {
		case "arg":
			args = append(args, n.Next.Value)
		case "copy":
			copies = append(copies, n.Original)
		case "from":
			stages++
		}
	}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "SERVICE") }) {
		t.Errorf("Dockerfile takes no SERVICE argument: %v", args)
	}
	if !slices.ContainsFunc(copies, func(c string) bool { return strings.Contains(c, "COPY pkg ./pkg") }) {
		t.Errorf("Dockerfile does not copy pkg/ into the build: %v", copies)
	}
	if stages < 2 {
		t.Errorf("Dockerfile has %d stages; want a build stage and a small runtime stage", stages)
	}
}

// deploy/env.example lists every variable the compose files take from the
// environment (or .env): it is where an operator learns what to set.
func TestEnvExampleListsEveryComposeVariable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "deploy/env.example"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z][A-Z0-9_]*)=`).FindAllStringSubmatch(string(b), -1) {
		listed[m[1]] = true
	}
	// Compose interpolates ${NAME} (with or without :-, :? and the like)
	// and $NAME alike; $$ is a literal dollar sign.
	ref := regexp.MustCompile(`\$\{?([A-Z][A-Z0-9_]*)`)
	for _, file := range composeFiles {
		c, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		refs := ref.FindAllStringSubmatch(strings.ReplaceAll(string(c), "$$", ""), -1)
		if len(refs) < 10 {
			t.Errorf("%s reads %d variables from the environment; the passwords alone are more: is the pattern still right?", file, len(refs))
		}
		for _, m := range refs {
			if !listed[m[1]] {
				t.Errorf("%s reads %s from the environment; deploy/env.example does not list it", file, m[1])
				listed[m[1]] = true // once
			}
		}
	}
}

// The partition count compose gives the topology and the services
// (SNIP_PARTITIONS: its default in each compose file, and the value
// deploy/env.example sets in .env) is the one deploy/nats is generated for
// (TestNATSConfigIsGenerated): the NATS users name each group's consumers
// by partition, so with another count the readers could not create or read
// the partitions past the generated ones.
func TestComposePartitionsAreTheOnesDeployNATSNames(t *testing.T) {
	want := strconv.Itoa(topology.DefaultPartitions)
	b, err := os.ReadFile(filepath.Join(root, "deploy/env.example"))
	if err != nil {
		t.Fatal(err)
	}
	var envFile []string
	for _, m := range regexp.MustCompile(`(?m)^([A-Z][A-Z0-9_]*=.*)$`).FindAllStringSubmatch(string(b), -1) {
		envFile = append(envFile, m[1])
	}
	envFile = append(envFile, "CONSOLE_TOKEN="+composeTestToken)
	eachCompose(t, func(t *testing.T, file string) {
		for _, env := range []struct {
			name string
			vars []string
		}{{"the defaults", []string{"CONSOLE_TOKEN=" + composeTestToken}}, {"deploy/env.example as .env", envFile}} {
			p, err := loadComposeWith(file, env.vars, "loadtest")
			if err != nil {
				t.Fatalf("%s with %s: %v", file, env.name, err)
			}
			given := 0
			for _, name := range slices.Sorted(maps.Keys(p.Services)) {
				v := p.Services[name].Environment["SNIP_PARTITIONS"]
				if v == nil {
					continue
				}
				given++
				if *v != want {
					t.Errorf("%s with %s: %s gets SNIP_PARTITIONS=%s, and deploy/nats names the consumers of %s partitions (regenerate it: go run ./deploy/check/cmd/natsconf -partitions N)",
						file, env.name, name, *v, want)
				}
			}
			if given < 4 {
				t.Errorf("%s with %s: only %d services get SNIP_PARTITIONS", file, env.name, given)
			}
		}
	})
}

// compose's loadtest service is run with `run --rm`: a report written inside
// the container is gone with it. Its report directory (--out, or the
// default loadtest/reports/<time>-<tag> under its working directory) is on
// a bind mount of the host's loadtest/reports, and the service runs as
// SNIP_LOADTEST_USER, so `make loadtest-compose` can run it as the host's
// user, who owns that folder (the image's user, 65532, does not).
func TestComposeLoadtestWritesItsReportOnTheHost(t *testing.T) {
	eachCompose(t, func(t *testing.T, file string) {
		p := loadCompose(t, file, "loadtest")
		svc, err := p.GetService("loadtest")
		if err != nil {
			t.Fatal(err)
		}
		out := path.Join(svc.WorkingDir, "loadtest", "reports")
		if i := slices.Index(svc.Command, "--out"); i >= 0 && i+1 < len(svc.Command) {
			out = svc.Command[i+1]
		}
		if !path.IsAbs(out) {
			t.Fatalf("loadtest writes its report to %q: no working_dir to place it", out)
		}
		reports, err := filepath.Abs(filepath.Join(root, "loadtest", "reports"))
		if err != nil {
			t.Fatal(err)
		}
		mounted := false
		for _, v := range svc.Volumes {
			if src, err := filepath.Abs(v.Source); v.Type != types.VolumeTypeBind || err != nil || src != reports {
				continue
			}
			if rel, err := filepath.Rel(v.Target, out); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
				mounted = true
			}
		}
		if !mounted {
			t.Errorf("loadtest writes its report to %s, which no bind mount of the host's loadtest/reports holds (volumes %+v)", out, svc.Volumes)
		}
		p, err = loadComposeWith(file, []string{"CONSOLE_TOKEN=" + composeTestToken, "SNIP_LOADTEST_USER=1000:1000"}, "loadtest")
		if err != nil {
			t.Fatal(err)
		}
		if svc, err = p.GetService("loadtest"); err != nil || svc.User != "1000:1000" {
			t.Errorf("with SNIP_LOADTEST_USER=1000:1000 loadtest runs as %q, want 1000:1000 (the host's user owns loadtest/reports)", svc.User)
		}
	})
}
