package check

import (
	"fmt"
	"slices"
	"strings"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// User is one NATS user of a Snip deployment and what it may publish and
// subscribe to. Every service connects as its own user, with the subjects it
// needs and no others (DESIGN.md: "per-service NATS users with least-privilege
// subject permissions").
type User struct {
	Name string
	// PasswordVar is the environment variable the server reads the password
	// from (nats-server substitutes $VAR in its configuration).
	PasswordVar string
	// Admin users may do anything (snipctl topology apply, operators).
	Admin bool
	Pub   []string
	Sub   []string
	// Why says in one line what the user is for.
	Why string
}

// jsBasics are what every JetStream client does: ask for account info and
// stream and consumer info (topology.Apply checks the streams it would
// create), and receive replies.
var jsBasics = []string{"$JS.API.INFO", "$JS.API.STREAM.INFO.*", "$JS.API.CONSUMER.INFO.*.*"}

// kvMembers is what a consumer-group member does in the snip_members bucket:
// heartbeat and leave (publish to its group's keys), watch the group, read a
// key, list keys.
func kvMembers(group string) []string {
	b := topology.MembersBucket
	return []string{
		"$KV." + b + "." + group + ".>",
		"$JS.API.CONSUMER.CREATE.KV_" + b + ".>",
		"$JS.API.CONSUMER.DELETE.KV_" + b + ".>",
		"$JS.API.CONSUMER.MSG.NEXT.KV_" + b + ".>",
		"$JS.API.DIRECT.GET.KV_" + b + ".>",
		"$JS.API.STREAM.MSG.GET.KV_" + b,
		"$JS.FC.KV_" + b + ".>",
	}
}

// groupReader is what pkg/reader needs for one consumer group on CLICKS.
func groupReader(group string, partitions int) []string {
	var out []string
	for p := range partitions {
		c := topology.GroupConsumerName(group, p)
		out = append(out,
			"$JS.API.CONSUMER.CREATE.CLICKS."+c+".>",
			"$JS.API.CONSUMER.DURABLE.CREATE.CLICKS."+c,
			"$JS.API.CONSUMER.MSG.NEXT.CLICKS."+c,
			"$JS.API.CONSUMER.UNPIN.CLICKS."+c,
			"$JS.API.CONSUMER.RESET.CLICKS."+c,
			"$JS.ACK.CLICKS."+c+".>",
		)
	}
	out = append(out, "$JS.API.STREAM.MSG.GET.CLICKS", "dead."+group+".>")
	return append(out, kvMembers(group)...)
}

// orderedOn is what an ordered (ephemeral) consumer on a stream needs.
func orderedOn(stream string) []string {
	return []string{
		"$JS.API.CONSUMER.CREATE." + stream + ".>",
		"$JS.API.CONSUMER.MSG.NEXT." + stream + ".>",
		"$JS.API.CONSUMER.DELETE." + stream + ".>",
	}
}

// durable is what reading one durable consumer needs.
func durable(stream, consumer string) []string {
	return []string{
		"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer,
		"$JS.ACK." + stream + "." + consumer + ".>",
	}
}

// Users returns every user of a deployment with the given CLICKS partitions.
func Users(partitions int) []User {
	inbox := []string{"_INBOX.>"}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return []User{
		{
			Name: "admin", PasswordVar: "SNIP_NATS_ADMIN_PASSWORD", Admin: true,
			Why: "snipctl (topology apply, replay, dlq) and operators",
		},
		{
			Name: "redirect", PasswordVar: "SNIP_NATS_REDIRECT_PASSWORD",
			Why: "the outbox relay publishes clicks, link events and preview jobs; an ordered consumer on LINKS invalidates the link cache",
			Pub: cat(jsBasics,
				[]string{"clicks.>", "links.>", events.PreviewJobSubject, "dead.outbox.>"},
				orderedOn(events.LinksStream)),
			Sub: inbox,
		},
		{
			Name: "clickcounter", PasswordVar: "SNIP_NATS_CLICKCOUNTER_PASSWORD",
			Why: "the click-counter group on CLICKS, its LINKS and FRAUD-verdict feeds",
			Pub: cat(jsBasics, groupReader(topology.GroupClickCounter, partitions),
				durable(events.LinksStream, topology.ClickCounterLinksConsumer),
				durable(events.FraudStream, topology.ClickCounterVerdictsConsumer)),
			Sub: inbox,
		},
		{
			Name: "fraud", PasswordVar: "SNIP_NATS_FRAUD_PASSWORD",
			Why: "the fraud-detection group on CLICKS; reads a partition's recent past on takeover; publishes alerts and verdicts",
			Pub: cat(jsBasics, groupReader(topology.GroupFraudDetection, partitions), orderedOn(events.ClicksStream),
				[]string{"fraud.alerts.>", "fraud.verdicts.>"}),
			Sub: inbox,
		},
		{
			Name: "warehouse", PasswordVar: "SNIP_NATS_WAREHOUSE_PASSWORD",
			Why: "the warehouse-loader group on CLICKS",
			Pub: cat(jsBasics, groupReader(topology.GroupWarehouseLoader, partitions)),
			Sub: inbox,
		},
		{
			Name: "preview", PasswordVar: "SNIP_NATS_PREVIEW_PASSWORD",
			Why: "competing workers on PREVIEW_JOBS; park dead jobs (copy by sequence, then delete)",
			Pub: cat(jsBasics, durable(events.PreviewJobsStream, topology.PreviewConsumer),
				[]string{"$JS.API.STREAM.MSG.GET.PREVIEW_JOBS", "$JS.API.STREAM.MSG.DELETE.PREVIEW_JOBS", "dead.preview.>"}),
			Sub: cat(inbox, []string{"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.PREVIEW_JOBS." + topology.PreviewConsumer}),
		},
		{
			Name: "webhooks", PasswordVar: "SNIP_NATS_WEBHOOKS_PASSWORD",
			Why: "the webhooks group on CLICKS and its FRAUD alerts consumer; replays read CLICKS and FRAUD; announces disabled endpoints",
			Pub: cat(jsBasics, groupReader(topology.GroupWebhooks, partitions),
				durable(events.FraudStream, topology.WebhooksAlertsConsumer),
				orderedOn(events.ClicksStream), orderedOn(events.FraudStream),
				[]string{topology.WebhooksDisabledSubjectPrefix + ">"}),
			Sub: inbox,
		},
		{
			Name: "console", PasswordVar: "SNIP_NATS_CONSOLE_PASSWORD",
			Why: "the operator console and the owners' live click streams: read every stream, request replays (the members bucket), redrive dead letters",
			Pub: cat(jsBasics,
				orderedOn(events.ClicksStream), orderedOn(events.FraudStream), orderedOn(events.DeadLetterStream),
				[]string{
					"$JS.API.CONSUMER.LIST.*", "$JS.API.CONSUMER.NAMES.*", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
					"$JS.API.STREAM.MSG.GET.*", "$JS.API.STREAM.MSG.DELETE.DEAD_LETTER",
					"$KV." + topology.MembersBucket + ".*.rewind",
					"$JS.API.DIRECT.GET.KV_" + topology.MembersBucket + ".>",
					"clicks.>", events.PreviewJobSubject, // redrive
				}),
			Sub: inbox,
		},
		{
			Name: "loadtest", PasswordVar: "SNIP_NATS_LOADTEST_PASSWORD",
			Why: "loadtest events publishes clicks; the oracle reads CLICKS and FRAUD back and the groups' lag",
			Pub: cat(jsBasics, []string{"clicks.>", "$JS.API.STREAM.MSG.GET.CLICKS", "$JS.API.CONSUMER.LIST.*"},
				orderedOn(events.ClicksStream), orderedOn(events.FraudStream)),
			Sub: inbox,
		},
	}
}

// RenderConfig renders deploy/nats/nats.conf: a single JetStream server with
// fsync every second and the users above in one account.
func RenderConfig(partitions int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Generated by "go run ./deploy/check/cmd/natsconf -partitions %d".
# Do not edit: change deploy/check/natsconf.go, regenerate; TestNATSConfigIsGenerated fails otherwise.
#
# One JetStream server for docker-compose. Passwords come from the environment
# (docker-compose.yml passes them; deploy/env.example lists them).

server_name: snip-nats
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
max_payload: 1MB

jetstream {
  store_dir: /data/jetstream
  # JetStream acknowledges a publish before it fsyncs. The server default
  # syncs every 2 minutes; Snip syncs every second (docs/durability.md gives
  # the measured cost of 1s and of "always").
  sync_interval: 1s
  max_memory_store: 1GB
  max_file_store: 100GB
}

include ./accounts.conf
`, partitions)
	return b.String()
}

// RenderAccounts renders deploy/nats/accounts.conf, shared by the single
// server and the cluster.
func RenderAccounts(partitions int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by \"go run ./deploy/check/cmd/natsconf -partitions %d\"; see deploy/check/natsconf.go.\n", partitions)
	b.WriteString("# Consumer-group permissions name each partition's consumer: regenerate when SNIP_PARTITIONS changes.\n\n")
	b.WriteString("accounts {\n  SNIP {\n    jetstream: enabled\n    users: [\n")
	for _, u := range Users(partitions) {
		fmt.Fprintf(&b, "      # %s: %s\n", u.Name, u.Why)
		fmt.Fprintf(&b, "      { user: %s, password: $%s", u.Name, u.PasswordVar)
		if u.Admin {
			b.WriteString(" }\n")
			continue
		}
		b.WriteString(", permissions: {\n")
		fmt.Fprintf(&b, "          publish: { allow: %s }\n", list(u.Pub))
		fmt.Fprintf(&b, "          subscribe: { allow: %s }\n", list(u.Sub))
		b.WriteString("      } }\n")
	}
	b.WriteString("    ]\n  }\n  SYS { users: [ { user: sys, password: $SNIP_NATS_SYS_PASSWORD } ] }\n}\nsystem_account: SYS\n")
	return b.String()
}

func list(subjects []string) string {
	q := make([]string, len(subjects))
	for i, s := range subjects {
		q[i] = `"` + s + `"`
	}
	return "[\n            " + strings.Join(q, ",\n            ") + "\n          ]"
}

// RenderClusterNode renders deploy/nats/cluster/nats-<n>.conf: one of three
// servers forming a JetStream cluster, for streams with 3 replicas
// (SNIP_REPLICAS=3). Each node acknowledges a publish once a majority
// stored it, so losing one machine loses no acknowledged click even with
// the 1 s fsync interval.
func RenderClusterNode(n, partitions int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Generated by "go run ./deploy/check/cmd/natsconf -partitions %d"; see deploy/check/natsconf.go.
# Node %d of a 3-node JetStream cluster (deploy/README.md).

server_name: nats-%d
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
max_payload: 1MB

jetstream {
  store_dir: /data/jetstream
  sync_interval: 1s
  max_memory_store: 1GB
  max_file_store: 100GB
}

cluster {
  name: snip
  listen: 0.0.0.0:6222
  routes: [
    nats-route://nats-1:6222
    nats-route://nats-2:6222
    nats-route://nats-3:6222
  ]
}

include ../accounts.conf
`, partitions, n, n)
	return b.String()
}

// Files returns every generated file, by path relative to the repository root.
func Files(partitions int) map[string]string {
	files := map[string]string{
		"deploy/nats/nats.conf":     RenderConfig(partitions),
		"deploy/nats/accounts.conf": RenderAccounts(partitions),
	}
	for n := 1; n <= 3; n++ {
		files[fmt.Sprintf("deploy/nats/cluster/nats-%d.conf", n)] = RenderClusterNode(n, partitions)
	}
	return files
}
