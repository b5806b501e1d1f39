package check

import (
	"fmt"
	"slices"
	"strings"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/topology"
)

// User is one NATS user of a Snip deployment and what it may publish and
// subscribe to. Every service connects as its own user, with the subjects it
// needs and no others: its own durable consumers by name, its own inbox
// prefix, and consumers it creates on the fly on the streams it reads.
//
// Adding a service is one more entry in Users: its Grants (groupReader for a
// consumer group on CLICKS) say what it needs; the denials that keep every
// other user off its consumers, and it off theirs, are computed from Owns.
type User struct {
	Name string
	// PasswordVar is the environment variable the server reads the password
	// from (nats-server substitutes $VAR in its configuration).
	PasswordVar string
	// Admin users may do anything (snipctl topology apply, operators).
	Admin bool
	// Grants are what the user needs, merged.
	Grants []Grant
	// Why says in one line what the user is for.
	Why string
}

// Consumer names a durable consumer on a stream.
type Consumer struct {
	Stream, Name string
	// Manage: the user creates and updates the consumer itself and moves its
	// pin (consumer groups); otherwise it only reads it (created by topology).
	Manage bool
	// Create: the user may also create the consumer (topology declares it;
	// the user makes it again, as declared, when it was deleted), without
	// moving its pin or its position as Manage may.
	Create bool
}

// Grant is one piece of what a user needs.
type Grant struct {
	// Pub and Sub are plain subjects (the user's inbox is added to Sub).
	Pub, Sub []string
	// Owns are durable consumers only this user may read, ack, create,
	// update, delete or re-pin. Every other user is denied them by name.
	Owns []Consumer
	// Ephemeral streams are those on which the user creates, reads and
	// deletes unnamed (ordered) consumers of its own. Consumer names are one
	// subject token, so this allows any name on the stream; the denials
	// derived from the other users' Owns keep it off their durables.
	Ephemeral []string
}

// InboxPrefix is the reply-subject prefix the user's connections use (pkg/natsconn
// derives the same from the user name); the user may subscribe below it and
// to no other inbox, so it cannot read replies meant for another service.
func (u User) InboxPrefix() string { return natsconn.InboxPrefix(u.Name) }

// consumerVerbs are the JetStream API subjects that act on one named
// consumer, for the stream s and consumer c, with the ack subject. Consumer
// info is not among them: every service checks the topology's shared
// consumers at start (topology.Apply), and info shows configuration and
// counts, never messages.
func consumerVerbs(s, c string) []string {
	a := "$JS.API.CONSUMER."
	return []string{
		a + "CREATE." + s + "." + c,
		a + "CREATE." + s + "." + c + ".>",
		a + "DURABLE.CREATE." + s + "." + c,
		a + "DELETE." + s + "." + c,
		a + "MSG.NEXT." + s + "." + c,
		a + "PAUSE." + s + "." + c,
		a + "UNPIN." + s + "." + c,
		a + "RESET." + s + "." + c,
		a + "LEADER.STEPDOWN." + s + "." + c,
		"$JS.ACK." + s + "." + c + ".>",
	}
}

// ownedSubjects are what a user needs on a consumer it owns.
func ownedSubjects(c Consumer) []string {
	out := []string{
		"$JS.API.CONSUMER.MSG.NEXT." + c.Stream + "." + c.Name,
		"$JS.ACK." + c.Stream + "." + c.Name + ".>",
	}
	a := "$JS.API.CONSUMER."
	if c.Manage || c.Create {
		out = append(out,
			a+"CREATE."+c.Stream+"."+c.Name,
			a+"CREATE."+c.Stream+"."+c.Name+".>",
			a+"DURABLE.CREATE."+c.Stream+"."+c.Name,
		)
	}
	if c.Manage {
		out = append(out,
			a+"UNPIN."+c.Stream+"."+c.Name,
			a+"RESET."+c.Stream+"."+c.Name,
		)
	}
	return out
}

// ephemeralSubjects are what creating, reading and deleting consumers of
// one's own on stream s needs.
func ephemeralSubjects(s string) []string {
	a := "$JS.API.CONSUMER."
	return []string{a + "CREATE." + s + ".>", a + "MSG.NEXT." + s + ".*", a + "DELETE." + s + ".*"}
}

func (u User) owns() []Consumer {
	var out []Consumer
	for _, g := range u.Grants {
		out = append(out, g.Owns...)
	}
	return out
}

// PubAllow is every subject the user may publish to.
func (u User) PubAllow() []string {
	var out []string
	for _, g := range u.Grants {
		out = append(out, g.Pub...)
		for _, c := range g.Owns {
			out = append(out, ownedSubjects(c)...)
		}
		for _, s := range g.Ephemeral {
			out = append(out, ephemeralSubjects(s)...)
		}
	}
	return sorted(out)
}

// SubAllow is every subject the user may subscribe to: its own inbox and
// what its grants add.
func (u User) SubAllow() []string {
	out := []string{u.InboxPrefix() + ".>"}
	for _, g := range u.Grants {
		out = append(out, g.Sub...)
	}
	return sorted(out)
}

// PubDeny names, among the subjects PubAllow would let through, those that
// act on another user's consumers.
func (u User) PubDeny(all []User) []string {
	allow := u.PubAllow()
	var out []string
	for _, o := range all {
		if o.Name == u.Name {
			continue
		}
		for _, c := range o.owns() {
			for _, subj := range consumerVerbs(c.Stream, c.Name) {
				lit := probe(subj)
				if slices.ContainsFunc(allow, func(p string) bool { return SubjectMatches(p, lit) }) {
					out = append(out, subj)
				}
			}
		}
	}
	return sorted(out)
}

// probe turns a subject that may end in ">" into a literal one it matches.
func probe(subj string) string {
	if strings.HasSuffix(subj, ".>") {
		return strings.TrimSuffix(subj, ">") + "x"
	}
	return subj
}

// SubjectMatches reports whether the NATS subject pattern p (with * and >
// wildcards) matches the literal subject s.
func SubjectMatches(p, s string) bool {
	pt, st := strings.Split(p, "."), strings.Split(s, ".")
	for i, t := range pt {
		if t == ">" {
			return len(st) > i
		}
		if i >= len(st) || (t != "*" && t != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}

func sorted(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

// jsBasics are what every JetStream client does: ask for account info and
// stream and consumer info (topology.Apply checks the streams and the shared
// consumers it would create).
var jsBasics = Grant{Pub: []string{"$JS.API.INFO", "$JS.API.STREAM.INFO.*", "$JS.API.CONSUMER.INFO.*.*"}}

// kvMembers is what a consumer-group member does in the snip_members bucket:
// heartbeat and leave (publish to its group's keys), watch the group, read a
// key, list keys.
func kvMembers(group string) Grant {
	b := topology.MembersBucket
	return Grant{
		Pub: []string{
			"$KV." + b + "." + group + ".>",
			"$JS.API.DIRECT.GET.KV_" + b + ".>",
			"$JS.API.STREAM.MSG.GET.KV_" + b,
			"$JS.FC.KV_" + b + ".>",
		},
		Ephemeral: []string{"KV_" + b},
	}
}

// kvUntrimmed is what the redirect's outbox relay does in its bucket of
// batches acknowledged but not trimmed: write a record, read one by direct
// get, delete one (a delete marker is a write to the key).
var kvUntrimmed = Grant{Pub: []string{
	"$KV." + topology.OutboxUntrimmedBucket + ".>",
	"$JS.API.DIRECT.GET.KV_" + topology.OutboxUntrimmedBucket + ".>",
}}

// groupReader is what pkg/reader needs for one consumer group on CLICKS:
// the group's partition consumers, its members' keys, its dead letters.
func groupReader(group string, partitions int) []Grant {
	g := Grant{Pub: []string{"$JS.API.STREAM.MSG.GET.CLICKS", "dead." + group + ".>"}}
	for p := range partitions {
		g.Owns = append(g.Owns, Consumer{Stream: events.ClicksStream, Name: topology.GroupConsumerName(group, p), Manage: true})
	}
	return []Grant{g, kvMembers(group)}
}

// reads is reading durable consumers that topology creates.
func reads(stream string, consumers ...string) Grant {
	var g Grant
	for _, c := range consumers {
		g.Owns = append(g.Owns, Consumer{Stream: stream, Name: c})
	}
	return g
}

// recreates is reading durable consumers that topology declares, and
// creating them again, as declared, when they are gone (the click counter's
// feeds).
func recreates(stream string, consumers ...string) Grant {
	var g Grant
	for _, c := range consumers {
		g.Owns = append(g.Owns, Consumer{Stream: stream, Name: c, Create: true})
	}
	return g
}

// ordered is creating ordered consumers of one's own on streams.
func ordered(streams ...string) Grant { return Grant{Ephemeral: streams} }

func grants(parts ...any) []Grant {
	var out []Grant
	for _, p := range parts {
		switch p := p.(type) {
		case Grant:
			out = append(out, p)
		case []Grant:
			out = append(out, p...)
		default:
			panic(fmt.Sprintf("grants: %T", p))
		}
	}
	return out
}

// Users returns every user of a deployment with the given CLICKS partitions.
func Users(partitions int) []User {
	return []User{
		{
			Name: "admin", PasswordVar: "SNIP_NATS_ADMIN_PASSWORD", Admin: true,
			Why: "snipctl (topology apply, replay, dlq) and operators",
		},
		{
			Name: "redirect", PasswordVar: "SNIP_NATS_REDIRECT_PASSWORD",
			Why: "the outbox relay publishes clicks, link events and preview jobs, and records a batch acknowledged but not trimmed (the untrimmed bucket); an ordered consumer on LINKS invalidates the link cache",
			Grants: grants(jsBasics,
				Grant{Pub: []string{"clicks.>", "links.>", events.PreviewJobSubject, "dead.outbox.>"}},
				kvUntrimmed,
				ordered(events.LinksStream)),
		},
		{
			Name: "clickcounter", PasswordVar: "SNIP_NATS_CLICKCOUNTER_PASSWORD",
			Why: "the click-counter group on CLICKS, its LINKS and FRAUD_VERDICTS feeds (created again as declared when deleted)",
			Grants: grants(jsBasics, groupReader(topology.GroupClickCounter, partitions),
				recreates(events.LinksStream, topology.ClickCounterLinksConsumer),
				recreates(events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumer)),
		},
		{
			Name: "fraud", PasswordVar: "SNIP_NATS_FRAUD_PASSWORD",
			Why: "the fraud-detection group on CLICKS and where each partition's statistics begin (its keys in the members bucket); reads a partition's recent past on takeover; publishes alerts (FRAUD) and verdict messages (FRAUD_VERDICTS)",
			Grants: grants(jsBasics, groupReader(topology.GroupFraudDetection, partitions), ordered(events.ClicksStream),
				Grant{Pub: []string{"fraud.alerts.>", "fraud.verdicts.>"}}),
		},
		{
			Name: "warehouse", PasswordVar: "SNIP_NATS_WAREHOUSE_PASSWORD",
			Why:    "the warehouse-loader group on CLICKS",
			Grants: grants(jsBasics, groupReader(topology.GroupWarehouseLoader, partitions)),
		},
		{
			Name: "preview", PasswordVar: "SNIP_NATS_PREVIEW_PASSWORD",
			Why: "competing workers on PREVIEW_JOBS; park dead jobs (copy by sequence, then delete), those that ran out of deliveries from their advisories on PREVIEW_ADVISORIES; requeue a last try handed back at shutdown",
			Grants: grants(jsBasics, reads(events.PreviewJobsStream, topology.PreviewConsumer),
				reads(events.PreviewAdvisoriesStream, topology.PreviewRescueConsumer),
				Grant{
					Pub: []string{"$JS.API.STREAM.MSG.GET.PREVIEW_JOBS", "$JS.API.STREAM.MSG.DELETE.PREVIEW_JOBS", "dead.preview.>", events.PreviewJobSubject},
				}),
		},
		{
			Name: "webhooks", PasswordVar: "SNIP_NATS_WEBHOOKS_PASSWORD",
			Why: "the webhooks group on CLICKS and its FRAUD alerts consumer; replays read CLICKS and FRAUD; announces disabled endpoints",
			Grants: grants(jsBasics, groupReader(topology.GroupWebhooks, partitions),
				reads(events.FraudStream, topology.WebhooksAlertsConsumer),
				ordered(events.ClicksStream, events.FraudStream),
				Grant{Pub: []string{topology.WebhooksDisabledSubjectPrefix + ">"}}),
		},
		{
			Name: "console", PasswordVar: "SNIP_NATS_CONSOLE_PASSWORD",
			Why: "the operator console and the owners' live click streams: read every stream, request replays (the members bucket), redrive dead letters, end sessions (the sessions bucket)",
			Grants: grants(jsBasics,
				ordered(events.ClicksStream, events.FraudStream, events.DeadLetterStream),
				Grant{Pub: []string{
					"$JS.API.CONSUMER.LIST.*", "$JS.API.CONSUMER.NAMES.*", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
					"$JS.API.STREAM.MSG.GET.*", "$JS.API.STREAM.MSG.DELETE.DEAD_LETTER",
					"$KV." + topology.MembersBucket + ".*.rewind",
					"$JS.API.DIRECT.GET.KV_" + topology.MembersBucket + ".>",
					"$KV." + topology.ConsoleSessionsBucket + ".>",
					"$JS.API.DIRECT.GET.KV_" + topology.ConsoleSessionsBucket + ".>",
					"clicks.>", events.PreviewJobSubject, // redrive
				}}),
		},
		{
			Name: "loadtest", PasswordVar: "SNIP_NATS_LOADTEST_PASSWORD",
			Why: "loadtest events publishes clicks; the oracle reads CLICKS, FRAUD_VERDICTS and FRAUD back and the groups' lag",
			Grants: grants(jsBasics,
				Grant{Pub: []string{"clicks.>", "$JS.API.STREAM.MSG.GET.CLICKS", "$JS.API.CONSUMER.LIST.*"}},
				ordered(events.ClicksStream, events.FraudVerdictsStream, events.FraudStream)),
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
	users := Users(partitions)
	for _, u := range users {
		fmt.Fprintf(&b, "      # %s: %s\n", u.Name, u.Why)
		fmt.Fprintf(&b, "      { user: %s, password: $%s", u.Name, u.PasswordVar)
		if u.Admin {
			b.WriteString(" }\n")
			continue
		}
		b.WriteString(", permissions: {\n")
		fmt.Fprintf(&b, "          publish: {\n            allow: %s\n", list(u.PubAllow(), 12))
		if deny := u.PubDeny(users); len(deny) > 0 {
			b.WriteString("            # other users' consumers, by name\n")
			fmt.Fprintf(&b, "            deny: %s\n", list(deny, 12))
		}
		b.WriteString("          }\n")
		fmt.Fprintf(&b, "          subscribe: { allow: %s }\n", list(u.SubAllow(), 10))
		b.WriteString("      } }\n")
	}
	b.WriteString("    ]\n  }\n  SYS { users: [ { user: sys, password: $SNIP_NATS_SYS_PASSWORD } ] }\n}\nsystem_account: SYS\n")
	return b.String()
}

// list renders subjects as a configuration list whose closing bracket is
// indented by indent spaces.
func list(subjects []string, indent int) string {
	q := make([]string, len(subjects))
	for i, s := range subjects {
		q[i] = `"` + s + `"`
	}
	in := strings.Repeat(" ", indent+2)
	return "[\n" + in + strings.Join(q, ",\n"+in) + "\n" + strings.Repeat(" ", indent) + "]"
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
