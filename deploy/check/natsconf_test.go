package check

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

var update = flag.Bool("update", false, "rewrite the generated files under deploy/nats")

const root = "../.."

// The checked-in NATS configuration is exactly what the model renders.
func TestNATSConfigIsGenerated(t *testing.T) {
	for path, want := range Files(topology.DefaultPartitions) {
		full := filepath.Join(root, path)
		if *update {
			if err := os.WriteFile(full, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(full)
		if err != nil {
			t.Fatalf("%s: %v (run go run ./deploy/check/cmd/natsconf)", path, err)
		}
		if string(got) != want {
			t.Errorf("%s differs from deploy/check/natsconf.go's model: run go run ./deploy/check/cmd/natsconf", path)
		}
	}
}

// setPasswords gives every user the password "pw-<user>", as the deployment
// would through the environment.
func setPasswords(t *testing.T) {
	for _, u := range Users(topology.DefaultPartitions) {
		t.Setenv(u.PasswordVar, "pw-"+u.Name)
	}
	t.Setenv("SNIP_NATS_SYS_PASSWORD", "pw-sys")
}

// Every configuration nats-server would be started with parses.
func TestNATSConfigsParse(t *testing.T) {
	setPasswords(t)
	for _, f := range []string{"deploy/nats/nats.conf", "deploy/nats/cluster/nats-1.conf", "deploy/nats/cluster/nats-2.conf", "deploy/nats/cluster/nats-3.conf"} {
		opts, err := server.ProcessConfigFile(filepath.Join(root, f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if !opts.JetStream || opts.SyncInterval != time.Second {
			t.Errorf("%s: jetstream %v, sync_interval %s; want JetStream with a 1s sync interval", f, opts.JetStream, opts.SyncInterval)
		}
	}
}

// startDeployServer runs nats-server with deploy/nats/nats.conf, on a free
// port with its store in a temporary folder.
func startDeployServer(t *testing.T) string {
	t.Helper()
	setPasswords(t)
	opts, err := server.ProcessConfigFile(filepath.Join(root, "deploy/nats/nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = filepath.Join(t.TempDir(), "js")
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server with deploy/nats/nats.conf did not start")
	}
	t.Cleanup(s.Shutdown)
	return s.ClientURL()
}

// client is a connection as one deploy user that records permission
// violations the server reports.
type client struct {
	nc         *nats.Conn
	js         jetstream.JetStream
	mu         sync.Mutex
	violations []string
	// accounted is how many of violations noViolations and violated have
	// reported or expected; violated reports any after them that came
	// before the one it waits for.
	accounted int
}

func connectAs(t *testing.T, url, user string) *client {
	t.Helper()
	c := &client{}
	// natsconn gives the connection the user's own inbox prefix, as in the
	// services; the error handler records what the server refused.
	nc, err := natsconn.Connect(natsconn.Config{URL: url, Name: "check-" + user, User: user, Password: "pw-" + user}, slog.New(slog.DiscardHandler), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
			c.mu.Lock()
			c.violations = append(c.violations, err.Error())
			c.mu.Unlock()
		}
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	c.js, _ = jetstream.New(nc, jetstream.WithDefaultTimeout(3*time.Second))
	return c
}

// noViolations reports the violations recorded so far. Flush makes the
// server's -ERR for anything sent so far arrive, but nats.go hands it to the
// error handler on a goroutine of its own, so it may not be recorded yet:
// the violated call that follows catches such a one (see there).
func (c *client) noViolations(t *testing.T, user string) {
	t.Helper()
	_ = c.nc.Flush()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.violations[c.accounted:] {
		t.Errorf("%s: %s", user, v)
	}
	c.accounted = len(c.violations)
}

// violated waits for the server to refuse subject, and reports every
// violation recorded before that refusal that was not yet reported or
// expected. nats.go runs the error handler for the server's -ERRs one at a
// time (one callback goroutine, first in first out), in the order the
// server sent them, which is the order of what was sent on the connection:
// once this refusal is recorded, so is the -ERR of anything sent before it.
func (c *client) violated(t *testing.T, user, subject string) bool {
	t.Helper()
	_ = c.nc.Flush()
	at := -1
	testenv.WaitFor(t, 5*time.Second, user+" denied "+subject, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i := c.accounted; i < len(c.violations); i++ {
			if strings.Contains(c.violations[i], subject) {
				at = i
				return true
			}
		}
		return false
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.violations[c.accounted:at] {
		t.Errorf("%s: %s (before the denied %s)", user, v, subject)
	}
	c.accounted = at + 1
	return true
}

func publishClick(t *testing.T, js jetstream.JetStream, owner, code string) events.Click {
	t.Helper()
	c := events.Click{V: 1, ID: events.NewID(), Time: time.Now().UTC(), Code: code, Owner: owner, Target: "https://example.com/", Visitor: "v"}
	b, _ := json.Marshal(c)
	if _, err := js.Publish(t.Context(), events.ClickSubject(owner, code), b, jetstream.WithMsgID(c.ID)); err != nil {
		t.Fatalf("publish click: %v", err)
	}
	return c
}

func fetchAll(t *testing.T, c jetstream.Consumer, want int) []jetstream.Msg {
	t.Helper()
	var out []jetstream.Msg
	deadline := time.Now().Add(10 * time.Second)
	for len(out) < want && time.Now().Before(deadline) {
		b, err := c.Fetch(want-len(out), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		for m := range b.Messages() {
			out = append(out, m)
		}
	}
	if len(out) < want {
		t.Fatalf("fetched %d of %d", len(out), want)
	}
	return out
}

// Every service's user can do its job with deploy/nats/nats.conf, and is
// refused what is not its job.
func TestServiceUsersHaveWhatTheyNeedAndNoMore(t *testing.T) {
	url := startDeployServer(t)
	ctx := t.Context()

	admin := connectAs(t, url, "admin")
	if err := topology.Apply(ctx, admin.js, topology.Defaults()); err != nil {
		t.Fatalf("admin: topology apply: %v", err)
	}
	if err := topology.ApplyClickCounter(ctx, admin.js); err != nil {
		t.Fatalf("admin: click counter consumers: %v", err)
	}

	t.Run("redirect", func(t *testing.T) {
		c := connectAs(t, url, "redirect")
		if err := topology.Apply(ctx, c.js, topology.Defaults()); err != nil {
			t.Fatalf("topology check with the read-only path: %v", err)
		}
		publishClick(t, c.js, "acme", "abc")
		le := events.LinkEvent{V: 1, ID: events.NewID(), Kind: events.LinkCreated, Time: time.Now().UTC(), Code: "abc", Owner: "acme", Target: "https://example.com/"}
		b, _ := json.Marshal(le)
		if _, err := c.js.Publish(ctx, events.LinkSubject(events.LinkCreated, "abc"), b); err != nil {
			t.Fatalf("publish link event: %v", err)
		}
		if _, err := c.js.Publish(ctx, events.PreviewJobSubject, []byte(`{"v":1}`)); err != nil {
			t.Fatalf("publish preview job: %v", err)
		}
		oc, err := c.js.OrderedConsumer(ctx, events.LinksStream, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatalf("ordered consumer on LINKS: %v", err)
		}
		fetchAll(t, oc, 1)
		// The relay's record of a batch acknowledged but not trimmed
		// (services/redirect/internal/outbox, records.go): written, read
		// by direct get, deleted at the revision read; a delete at an
		// older revision is refused by the stream, not by permissions.
		kv, err := c.js.KeyValue(ctx, topology.OutboxUntrimmedBucket)
		if err != nil {
			t.Fatalf("bucket %s: %v", topology.OutboxUntrimmedBucket, err)
		}
		rev, err := kv.Put(ctx, "0.clicks", []byte(`{"v":1}`))
		if err != nil {
			t.Fatalf("write a record: %v", err)
		}
		if e, err := kv.Get(ctx, "0.clicks"); err != nil || e.Revision() != rev {
			t.Fatalf("read the record: %v, %v; want revision %d", e, err, rev)
		}
		newer, err := kv.Put(ctx, "0.clicks", []byte(`{"v":1}`))
		if err != nil {
			t.Fatalf("write a newer record: %v", err)
		}
		if err := kv.Delete(ctx, "0.clicks", jetstream.LastRevision(rev)); err == nil {
			t.Fatal("a delete at the revision read deleted a newer record")
		}
		if err := kv.Delete(ctx, "0.clicks", jetstream.LastRevision(newer)); err != nil {
			t.Fatalf("delete the record at its revision: %v", err)
		}
		if _, err := kv.Get(ctx, "0.clicks"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("read the deleted record: %v, want not found", err)
		}
		c.noViolations(t, "redirect")
		_ = c.nc.Publish("fraud.alerts.abc", nil)
		c.violated(t, "redirect", "fraud.alerts.abc")
	})

	// The bucket of untrimmed batches is the redirect's alone: no other
	// service user may write a record (which would make a relay trim
	// acknowledged entries it names, or hold a lane up) or read one.
	t.Run("untrimmed bucket", func(t *testing.T) {
		put := "$KV." + topology.OutboxUntrimmedBucket + ".0.clicks"
		get := "$JS.API.DIRECT.GET.KV_" + topology.OutboxUntrimmedBucket + ".$KV." + topology.OutboxUntrimmedBucket + ".0.clicks"
		checked := 0
		for _, u := range Users(topology.DefaultPartitions) {
			if u.Admin || u.Name == "redirect" {
				continue
			}
			c := connectAs(t, url, u.Name)
			_ = c.nc.Publish(put, []byte(`{}`))
			c.violated(t, u.Name, put)
			_ = c.nc.Publish(get, nil)
			c.violated(t, u.Name, get)
			checked++
		}
		if checked < 6 {
			t.Fatalf("checked %d users", checked)
		}
	})

	for _, g := range []struct{ user, group string }{
		{"clickcounter", topology.GroupClickCounter},
		{"fraud", topology.GroupFraudDetection},
		{"warehouse", topology.GroupWarehouseLoader},
	} {
		t.Run(g.user, func(t *testing.T) {
			c := connectAs(t, url, g.user)
			var handled atomic.Int64
			rctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- reader.Run(rctx, c.js, reader.Config{Group: g.group, Member: "m", LeaseTTL: time.Second},
					func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
			}()
			before, _ := reader.Lag(ctx, admin.js, g.group)
			_ = before
			publishClick(t, admin.js, "acme", "k"+g.user)
			// Malformed events are parked on dead.<group>.malformed.
			if _, err := admin.js.Publish(ctx, events.ClickSubject("acme", "bad"), []byte("{")); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 30*time.Second, g.user+" handles clicks as its group", func() bool { return handled.Load() >= 1 })
			testenv.WaitFor(t, 30*time.Second, g.user+" caught up (acks and parking allowed)", func() bool {
				lag, err := reader.Lag(ctx, c.js, g.group)
				if err != nil {
					return false
				}
				for _, pl := range lag {
					if pl.Pending+uint64(pl.AckPending) > 0 {
						return false
					}
				}
				return true
			})
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			switch g.user {
			case "clickcounter":
				// It reads and acks a message of each of its consumers: the
				// link event the redirect user published, and a verdict
				// message (the fraud user's come later).
				if _, err := admin.js.Publish(ctx, events.FraudVerdictBatchSubject(0), []byte(`{}`)); err != nil {
					t.Fatalf("admin: publish a verdict message: %v", err)
				}
				for _, cons := range []struct{ stream, name string }{
					{events.LinksStream, topology.ClickCounterLinksConsumer},
					{events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumer},
				} {
					cc, err := c.js.Consumer(ctx, cons.stream, cons.name)
					if err != nil {
						t.Fatalf("consumer %s: %v", cons.name, err)
					}
					if err := fetchAll(t, cc, 1)[0].DoubleAck(ctx); err != nil {
						t.Fatalf("ack on %s: %v", cons.name, err)
					}
				}
				// An operator deletes a feed's consumer: the counter creates
				// it again as the topology declares it.
				for _, cons := range []struct {
					stream string
					cfg    jetstream.ConsumerConfig
				}{
					{events.LinksStream, topology.ClickCounterLinksConsumerConfig()},
					{events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumerConfig()},
				} {
					if err := admin.js.DeleteConsumer(ctx, cons.stream, cons.cfg.Durable); err != nil {
						t.Fatalf("admin: delete %s: %v", cons.cfg.Durable, err)
					}
					if _, err := c.js.CreateConsumer(ctx, cons.stream, cons.cfg); err != nil {
						t.Fatalf("create %s again: %v", cons.cfg.Durable, err)
					}
				}
			case "fraud":
				if _, err := c.js.Publish(ctx, events.FraudAlertSubject("kfraud"), []byte(`{}`)); err != nil {
					t.Fatalf("publish alert: %v", err)
				}
				if _, err := c.js.Publish(ctx, events.FraudVerdictSubject("acme", "kfraud"), []byte(`{}`)); err != nil {
					t.Fatalf("publish verdict: %v", err)
				}
				if _, err := c.js.Publish(ctx, events.FraudVerdictBatchSubject(events.Partition("kfraud", 8)), []byte(`{}`)); err != nil {
					t.Fatalf("publish verdict message: %v", err)
				}
				oc, err := c.js.OrderedConsumer(ctx, events.ClicksStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.PartitionFilter(events.Partition("kfraud", 8))}})
				if err != nil {
					t.Fatalf("ordered consumer on a partition: %v", err)
				}
				fetchAll(t, oc, 1)
				// Where a partition's statistics begin, as kvorigin records
				// it: "<group>.origin.<partition>" in the members bucket,
				// created, read, and lowered by revision.
				kv, err := c.js.KeyValue(ctx, topology.MembersBucket)
				if err != nil {
					t.Fatalf("members bucket: %v", err)
				}
				key := topology.GroupFraudDetection + ".origin.3"
				rev, err := kv.Create(ctx, key, []byte("42"))
				if err != nil {
					t.Fatalf("create %s: %v", key, err)
				}
				if e, err := kv.Get(ctx, key); err != nil || string(e.Value()) != "42" {
					t.Fatalf("get %s: %v, %v", key, e, err)
				}
				if _, err := kv.Update(ctx, key, []byte("7"), rev); err != nil {
					t.Fatalf("update %s: %v", key, err)
				}
				if _, err := kv.Get(ctx, topology.GroupFraudDetection+".origin.4"); !errors.Is(err, jetstream.ErrKeyNotFound) {
					t.Fatalf("get a key not written: %v, want not found", err)
				}
			}
			c.noViolations(t, g.user)
			_ = c.nc.Publish("clicks.acme.forged", nil)
			c.violated(t, g.user, "clicks.acme.forged")
			// Another group's keys (its origins, its leases) are not its to write.
			other := "$KV." + topology.MembersBucket + "." + topology.GroupWarehouseLoader + ".origin.0"
			if g.group == topology.GroupWarehouseLoader {
				other = "$KV." + topology.MembersBucket + "." + topology.GroupClickCounter + ".origin.0"
			}
			_ = c.nc.Publish(other, []byte("1"))
			c.violated(t, g.user, other)
		})
	}

	t.Run("preview", func(t *testing.T) {
		c := connectAs(t, url, "preview")
		cons, err := c.js.Consumer(ctx, events.PreviewJobsStream, topology.PreviewConsumer)
		if err != nil {
			t.Fatal(err)
		}
		msgs := fetchAll(t, cons, 1) // the job the redirect user queued
		md, _ := msgs[0].Metadata()
		s, err := c.js.Stream(ctx, events.PreviewJobsStream)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetMsg(ctx, md.Sequence.Stream); err != nil {
			t.Fatalf("get job by sequence: %v", err)
		}
		if _, err := deadletter.Publish(ctx, c.js, deadletter.Parcel{Source: "preview", Reason: "test", Stream: events.PreviewJobsStream,
			Subject: events.PreviewJobSubject, Seq: md.Sequence.Stream, Data: msgs[0].Data()}); err != nil {
			t.Fatalf("park a job: %v", err)
		}
		if err := s.DeleteMsg(ctx, md.Sequence.Stream); err != nil {
			t.Fatalf("delete the parked job: %v", err)
		}
		// The rescuers take the MAX_DELIVERIES advisories PREVIEW_ADVISORIES
		// keeps (one published by admin stands in for the server's), put
		// one off or ack it.
		adv := events.MaxDeliveriesAdvisorySubject(events.PreviewJobsStream, topology.PreviewConsumer)
		if _, err := admin.js.Publish(ctx, adv, []byte(`{"stream":"PREVIEW_JOBS","stream_seq":1,"deliveries":5}`)); err != nil {
			t.Fatalf("admin: publish an advisory: %v", err)
		}
		rc, err := c.js.Consumer(ctx, events.PreviewAdvisoriesStream, topology.PreviewRescueConsumer)
		if err != nil {
			t.Fatal(err)
		}
		m := fetchAll(t, rc, 1)[0]
		if err := m.InProgress(); err != nil {
			t.Fatalf("advisory in progress: %v", err)
		}
		if err := m.NakWithDelay(10 * time.Millisecond); err != nil {
			t.Fatalf("put an advisory off: %v", err)
		}
		if err := fetchAll(t, rc, 1)[0].DoubleAck(ctx); err != nil {
			t.Fatalf("ack an advisory: %v", err)
		}
		c.noViolations(t, "preview")
		_ = c.nc.Publish("clicks.acme.forged", nil)
		c.violated(t, "preview", "clicks.acme.forged")
	})

	t.Run("console", func(t *testing.T) {
		c := connectAs(t, url, "console")
		if _, err := reader.Lag(ctx, c.js, topology.GroupClickCounter); err != nil {
			t.Fatalf("lag: %v", err)
		}
		if _, err := reader.Rewind(ctx, c.js, topology.GroupWarehouseLoader, reader.FromSeq(1)); err != nil {
			t.Fatalf("rewind: %v", err)
		}
		groups, err := deadletter.List(ctx, c.js)
		if err != nil || len(groups) == 0 {
			t.Fatalf("list dead letters: %v, %d groups", err, len(groups))
		}
		// The click counter's letter of the malformed event: a group's
		// letter of a click is redriven as the copy of what CLICKS holds at
		// its sequence, which the console reads by sequence.
		l := groups[0].Newest
		if l.Source != topology.GroupClickCounter || l.Stream != events.ClicksStream || l.OrigSeq == 0 {
			t.Fatalf("the first group's newest letter is %s's of %s seq %d, want the click counter's of a click", l.Source, l.Stream, l.OrigSeq)
		}
		cs, err := c.js.Stream(ctx, events.ClicksStream)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.GetMsg(ctx, l.OrigSeq); err != nil {
			t.Fatalf("get a click by sequence: %v", err)
		}
		if _, err := deadletter.Redrive(ctx, c.js, l.Seq); err != nil {
			t.Fatalf("redrive: %v", err)
		}
		for _, stream := range []string{events.ClicksStream, events.FraudStream} {
			oc, err := c.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
			if err != nil {
				t.Fatalf("ordered consumer on %s: %v", stream, err)
			}
			fetchAll(t, oc, 1)
		}
		c.noViolations(t, "console")
		_ = c.nc.Publish("fraud.alerts.forged", nil)
		c.violated(t, "console", "fraud.alerts.forged")
	})

	t.Run("loadtest", func(t *testing.T) {
		c := connectAs(t, url, "loadtest")
		publishClick(t, c.js, "acme", "lt")
		if _, err := reader.Lag(ctx, c.js, topology.GroupClickCounter); err != nil {
			t.Fatalf("lag: %v", err)
		}
		oc, err := c.js.OrderedConsumer(ctx, events.ClicksStream, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		fetchAll(t, oc, 1)
		// The oracle reads the verdict messages back, and the counter's
		// position on FRAUD_VERDICTS.
		vc, err := c.js.OrderedConsumer(ctx, events.FraudVerdictsStream, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatalf("ordered consumer on %s: %v", events.FraudVerdictsStream, err)
		}
		fetchAll(t, vc, 1)
		// And the alerts on FRAUD (the fraud user published one above).
		ac, err := c.js.OrderedConsumer(ctx, events.FraudStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.FraudAlertSubjects}})
		if err != nil {
			t.Fatalf("ordered consumer on %s: %v", events.FraudStream, err)
		}
		fetchAll(t, ac, 1)
		c.noViolations(t, "loadtest")
		_ = c.nc.Publish("links.created.forged", nil)
		c.violated(t, "loadtest", "links.created.forged")
	})
}

// A dead letter's Snip-Dead-* headers are its publisher's word: the
// warehouse's user, which may not publish a preview job or a link event,
// plants letters on its own dead.warehouse-loader.* subjects saying they
// come from PREVIEW_JOBS and LINKS. Neither the console (which may publish
// preview jobs for redrive) nor an operator's snipctl (admin) may send them
// there: only preview and the redirect's outbox relay park jobs, and only
// the click counter and the relay link events.
func TestALetterOfAServiceIsNotRedrivenWhereTheServiceMayNotPublish(t *testing.T) {
	url := startDeployServer(t)
	ctx := t.Context()
	admin := connectAs(t, url, "admin")
	if err := topology.Apply(ctx, admin.js, topology.Defaults()); err != nil {
		t.Fatalf("admin: topology apply: %v", err)
	}
	console := connectAs(t, url, "console")
	w := connectAs(t, url, "warehouse")
	_ = w.nc.Publish(events.PreviewJobSubject, []byte(`{}`))
	w.violated(t, "warehouse", events.PreviewJobSubject)
	for _, f := range []struct {
		stream, subject, data string
		by                    *client
	}{
		{events.PreviewJobsStream, events.PreviewJobSubject, `{"v":1,"id":"planted-job","code":"abc","owner":"acme","target":"http://169.254.169.254/"}`, console},
		{events.LinksStream, "links.deleted.abc", `{"v":1,"id":"planted-link","kind":"deleted","code":"abc","owner":"acme"}`, admin},
	} {
		m := nats.NewMsg("dead." + topology.GroupWarehouseLoader + ".bad_row")
		m.Data = []byte(f.data)
		m.Header.Set(events.HeaderDeadSource, f.stream)
		m.Header.Set(events.HeaderDeadSubject, f.subject)
		m.Header.Set(events.HeaderDeadSeq, "1")
		ack, err := w.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatalf("warehouse: publish a letter on its own subject: %v", err)
		}
		r, err := deadletter.Redrive(ctx, f.by.js, ack.Sequence)
		if !errors.Is(err, deadletter.ErrNotRedrivable) {
			t.Errorf("the warehouse's letter saying it comes from %s: redrive = %s on %s seq %d, %v; want ErrNotRedrivable",
				f.stream, r.Subject, r.Stream, r.Seq, err)
		}
	}
	for _, stream := range []string{events.PreviewJobsStream, events.LinksStream} {
		s, err := admin.js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().State.Msgs != 0 {
			t.Errorf("%s holds %d messages, want 0", stream, s.CachedInfo().State.Msgs)
		}
	}
}

// Every consumer group's user may publish its own dead.<group>.> letters,
// and every group parks clicks: the webhooks' user (the one closest to
// owners' systems) plants letters saying a made-up click came from CLICKS,
// one at a real click's sequence and one with none. Neither the console nor
// an operator's snipctl (admin) redrives them, and CLICKS gains nothing; the
// console reads CLICKS by sequence to tell, with no permission violation.
func TestAClickAGroupsUserPlantsIsNotRedriven(t *testing.T) {
	url := startDeployServer(t)
	ctx := t.Context()
	admin := connectAs(t, url, "admin")
	if err := topology.Apply(ctx, admin.js, topology.Defaults()); err != nil {
		t.Fatalf("admin: topology apply: %v", err)
	}
	real := publishClick(t, admin.js, "acme", "abc")
	cs, err := admin.js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := cs.GetLastMsgForSubject(ctx, events.PartitionedClickSubject(topology.DefaultPartitions, "acme", "abc"))
	if err != nil {
		t.Fatal(err)
	}
	console := connectAs(t, url, "console")
	w := connectAs(t, url, "webhooks")
	madeUp := real
	madeUp.ID, madeUp.Visitor = events.NewID(), "nobody"
	data, _ := json.Marshal(madeUp)
	for _, f := range []struct {
		name string
		seq  string
		want error
	}{
		{"at a real click's sequence", strconv.FormatUint(stored.Sequence, 10), deadletter.ErrOriginalDiffers},
		{"with no sequence", "", deadletter.ErrNotRedrivable},
	} {
		m := nats.NewMsg("dead." + topology.GroupWebhooks + ".bad_endpoint")
		m.Data = data
		m.Header.Set(events.HeaderDeadSource, events.ClicksStream)
		m.Header.Set(events.HeaderDeadSubject, stored.Subject)
		if f.seq != "" {
			m.Header.Set(events.HeaderDeadSeq, f.seq)
		}
		ack, err := w.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatalf("webhooks: publish a letter on its own subject: %v", err)
		}
		for _, by := range []struct {
			user string
			c    *client
		}{{"console", console}, {"admin", admin}} {
			r, err := deadletter.Redrive(ctx, by.c.js, ack.Sequence)
			if !errors.Is(err, f.want) {
				t.Errorf("%s: the webhooks' letter of a made-up click %s: redrive = %s on %s seq %d, %v; want %v",
					by.user, f.name, r.Subject, r.Stream, r.Seq, err, f.want)
			}
		}
	}
	console.noViolations(t, "console")
	info, err := cs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("CLICKS holds %d messages, want the real click alone", info.State.Msgs)
	}
}
