package check

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

func TestSubjectMatches(t *testing.T) {
	for _, c := range []struct {
		p, s string
		want bool
	}{
		{"a.b", "a.b", true},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{"$JS.API.CONSUMER.DELETE.CLICKS.*", "$JS.API.CONSUMER.DELETE.CLICKS.click-counter-p0", true},
		{"$JS.API.CONSUMER.CREATE.CLICKS.>", "$JS.API.CONSUMER.CREATE.CLICKS", false},
		{"a.b.c", "a.b", false},
	} {
		if got := SubjectMatches(c.p, c.s); got != c.want {
			t.Errorf("SubjectMatches(%q, %q) = %v, want %v", c.p, c.s, got, c.want)
		}
	}
}

// createAllConsumers creates every durable consumer some user owns, as the
// services and topology would, so that the denials below act on real ones.
func createAllConsumers(t *testing.T, js jetstream.JetStream, users []User) map[Consumer]jetstream.ConsumerConfig {
	t.Helper()
	ctx := t.Context()
	out := map[Consumer]jetstream.ConsumerConfig{}
	for _, u := range users {
		for _, c := range u.owns() {
			key := Consumer{Stream: c.Stream, Name: c.Name}
			if cons, err := js.Consumer(ctx, c.Stream, c.Name); err == nil {
				out[key] = cons.CachedInfo().Config
				continue
			}
			cfg := jetstream.ConsumerConfig{Durable: c.Name, AckPolicy: jetstream.AckExplicitPolicy}
			cons, err := js.CreateOrUpdateConsumer(ctx, c.Stream, cfg)
			if err != nil {
				t.Fatalf("admin: create %s on %s: %v", c.Name, c.Stream, err)
			}
			out[key] = cons.CachedInfo().Config
		}
	}
	return out
}

// No user may act on another user's consumers (create or update, delete,
// pull, ack, pause, re-pin, reset) or read another user's inbox, against
// nats-server running deploy/nats/nats.conf. Every pair of users is tried,
// each refusal must come back from the server as a permission violation, and
// afterwards every consumer is still there, unchanged.
func TestServiceUsersAreDeniedOtherUsersConsumersAndInboxes(t *testing.T) {
	url := startDeployServer(t)
	ctx := t.Context()
	users := Users(topology.DefaultPartitions)

	admin := connectAs(t, url, "admin")
	if err := topology.Apply(ctx, admin.js, topology.Defaults()); err != nil {
		t.Fatalf("admin: topology apply: %v", err)
	}
	before := createAllConsumers(t, admin.js, users)
	if len(before) < 3*topology.DefaultPartitions+3 {
		t.Fatalf("only %d owned consumers in the model", len(before))
	}

	// The attacks the review ran with the NATS CLI, through the JetStream API:
	// each is refused (the request gets no answer) and changes nothing.
	attack := func(user, what string, f func(ctx context.Context, js jetstream.JetStream) error) {
		t.Helper()
		c := connectAs(t, url, user)
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := f(actx, c.js); err == nil {
			t.Errorf("%s could %s", user, what)
		}
	}
	attack("fraud", "delete click-counter-p0", func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteConsumer(ctx, events.ClicksStream, topology.GroupConsumerName(topology.GroupClickCounter, 0))
	})
	attack("fraud", "edit click-counter-p0's filter", func(ctx context.Context, js jetstream.JetStream) error {
		_, err := js.UpdateConsumer(ctx, events.ClicksStream, jetstream.ConsumerConfig{
			Durable: topology.GroupConsumerName(topology.GroupClickCounter, 0), FilterSubject: "nothing.>", AckPolicy: jetstream.AckExplicitPolicy})
		return err
	})
	attack("fraud", "create click-counter-p1 under another name in the subject", func(ctx context.Context, js jetstream.JetStream) error {
		// The server refuses a body whose durable name differs from the
		// subject's, so the name in the subject is the one to deny.
		_, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, jetstream.ConsumerConfig{
			Name: "fraud-own", Durable: topology.GroupConsumerName(topology.GroupClickCounter, 1), AckPolicy: jetstream.AckExplicitPolicy})
		return err
	})
	attack("console", "delete warehouse-loader-p0", func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteConsumer(ctx, events.ClicksStream, topology.GroupConsumerName(topology.GroupWarehouseLoader, 0))
	})
	attack("redirect", "delete click-counter-links on LINKS", func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteConsumer(ctx, events.LinksStream, topology.ClickCounterLinksConsumer)
	})
	// A click waits on click-counter-p0; preview cannot pull it.
	code := "spied"
	for i := 0; events.Partition(code, topology.DefaultPartitions) != 0; i++ {
		code = "spied" + strconv.Itoa(i)
	}
	publishClick(t, admin.js, "acme", code)
	p0 := topology.GroupConsumerName(topology.GroupClickCounter, 0)
	attack("preview", "pull from click-counter-p0", func(ctx context.Context, js jetstream.JetStream) error {
		cons, err := js.Consumer(ctx, events.ClicksStream, p0)
		if err != nil {
			return err
		}
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			return err
		}
		for range b.Messages() {
			return nil
		}
		return errors.New("no message")
	})

	// Preview listening on the counter's inbox gets nothing of the pull the
	// counter makes: the subscription itself is refused.
	spy := connectAs(t, url, "preview")
	var spied atomic.Int64
	spySub, err := spy.nc.Subscribe(natsInbox("clickcounter")+".>", func(*nats.Msg) { spied.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	spy.violated(t, "preview", natsInbox("clickcounter")+".>")
	counter := connectAs(t, url, "clickcounter")
	cc, err := counter.js.Consumer(ctx, events.ClicksStream, p0)
	if err != nil {
		t.Fatal(err)
	}
	fetchAll(t, cc, 1)
	_ = spy.nc.Flush()
	_ = spySub.Unsubscribe()
	if n := spied.Load(); n != 0 {
		t.Errorf("preview received %d messages on the counter's inbox", n)
	}

	// Every pair: each verb on each consumer of every other user, and every
	// other user's inbox, the shared "_INBOX" and everything.
	for _, u := range users {
		if u.Admin {
			continue
		}
		t.Run(u.Name, func(t *testing.T) {
			c := connectAs(t, url, u.Name)
			var want []string
			for _, o := range users {
				if o.Name == u.Name {
					continue
				}
				for _, cons := range o.owns() {
					for _, subj := range consumerVerbs(cons.Stream, cons.Name) {
						subj = probe(subj)
						if err := c.nc.Publish(subj, []byte(`{}`)); err != nil {
							t.Fatal(err)
						}
						want = append(want, subj)
					}
				}
				if o.Admin {
					continue
				}
				in := o.InboxPrefix() + ".>"
				if _, err := c.nc.Subscribe(in, func(*nats.Msg) {}); err != nil {
					t.Fatal(err)
				}
				want = append(want, in)
			}
			for _, in := range []string{"_INBOX.>", ">"} {
				if _, err := c.nc.Subscribe(in, func(*nats.Msg) {}); err != nil {
					t.Fatal(err)
				}
				want = append(want, in)
			}
			_ = c.nc.Flush()
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				c.mu.Lock()
				n := len(c.violations)
				c.mu.Unlock()
				if n >= len(want) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			c.mu.Lock()
			got := strings.Join(c.violations, "\n")
			c.mu.Unlock()
			for _, w := range want {
				if !strings.Contains(got, `"`+w+`"`) {
					t.Errorf("%s was not refused %s", u.Name, w)
				}
			}
		})
	}

	// Nothing was deleted or changed.
	for key, cfg := range before {
		cons, err := admin.js.Consumer(ctx, key.Stream, key.Name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Errorf("consumer %s on %s was deleted", key.Name, key.Stream)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := cons.CachedInfo().Config; got.FilterSubject != cfg.FilterSubject || !slices.Equal(got.FilterSubjects, cfg.FilterSubjects) {
			t.Errorf("consumer %s on %s: filter %q %v, was %q %v", key.Name, key.Stream, got.FilterSubject, got.FilterSubjects, cfg.FilterSubject, cfg.FilterSubjects)
		}
	}
}

func natsInbox(user string) string {
	for _, u := range Users(topology.DefaultPartitions) {
		if u.Name == user {
			return u.InboxPrefix()
		}
	}
	panic("no user " + user)
}
