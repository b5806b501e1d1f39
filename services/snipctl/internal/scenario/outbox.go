package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
)

var outbox = Scenario{
	Name:   "outbox",
	Claim:  "write the link, then publish, and a crash in between leaves links with no event; through the outbox there are none, and no event for a write that was rolled back",
	Needs:  "nats, redis",
	Lesson: 2 * time.Second,
	run:    runOutbox,
}

const (
	outboxLinks = 50
	outboxCrash = 5 // every 5th create crashes at the design's weak point
	outboxAbort = 7 // every 7th create is rolled back (the write fails)
)

var errRolledBack = errors.New("write rolled back")

// The same Redis shapes as the redirect service (services/redirect/internal/
// linkstore and outbox): a link hash, and an outbox stream whose entries
// carry the event ID, subject and payload, in one MULTI/EXEC with the link.
func linkKey(design, code string) string { return "snip:{s0}:" + design + ":link:" + code }

const outboxKey = "snip:{s0}:outbox:links"

func runOutbox(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, 4)
	if err != nil {
		return err
	}
	rdb, err := e.Redis(ctx)
	if err != nil {
		return err
	}
	event := func(design string, i int) (string, []byte, string) {
		code := fmt.Sprintf("%s%d", design, i)
		ev := events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: events.LinkCreated, Time: time.Now().UTC(), Code: code, Owner: owner, Target: "https://example.com/"}
		b, _ := json.Marshal(ev)
		return code, b, ev.ID
	}
	publish := func(code string, data []byte, id string) error {
		_, err := js.Publish(ctx, events.LinkSubject(events.LinkCreated, code), data, jetstream.WithMsgID(id), jetstream.WithExpectStream(events.LinksStream))
		return err
	}

	// Naive 1: write, then publish; the process dies in between.
	e.say("naive: write the link, then publish (crash between, every %dth)", outboxCrash)
	for i := range outboxLinks {
		code, data, id := event("wp", i)
		if err := rdb.HSet(ctx, linkKey("wp", code), "target", "https://example.com/").Err(); err != nil {
			return err
		}
		if i%outboxCrash == outboxCrash-1 {
			continue // crashed: the event is never published
		}
		if err := publish(code, data, id); err != nil {
			return err
		}
	}
	// Naive 2: publish, then write; the write fails (rolled back).
	e.say("naive: publish, then write the link (the write fails every %dth)", outboxAbort)
	for i := range outboxLinks {
		code, data, id := event("pw", i)
		if err := publish(code, data, id); err != nil {
			return err
		}
		if i%outboxAbort == outboxAbort-1 {
			continue // the write failed: the event is out, the link is not
		}
		if err := rdb.HSet(ctx, linkKey("pw", code), "target", "https://example.com/").Err(); err != nil {
			return err
		}
	}
	// The outbox: link and outbox entry in one transaction; a relay
	// publishes entries with their event ID as Nats-Msg-Id and deletes them
	// after the ack. The relay crashes after publishing and before deleting.
	e.say("outbox: link + outbox entry in one MULTI/EXEC; relay crashes between publish and delete every %dth", outboxCrash)
	for i := range outboxLinks {
		code, data, id := event("ob", i)
		err := rdb.Watch(ctx, func(tx *redis.Tx) error {
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.HSet(ctx, linkKey("ob", code), "target", "https://example.com/")
				p.XAdd(ctx, &redis.XAddArgs{Stream: outboxKey, Values: []any{"id", id, "subject", events.LinkSubject(events.LinkCreated, code), "data", data}})
				if i%outboxAbort == outboxAbort-1 {
					return errRolledBack // validation failed before EXEC: nothing is written
				}
				return nil
			})
			return err
		}, linkKey("ob", code))
		if err != nil && !errors.Is(err, errRolledBack) {
			return err
		}
	}
	relayed, redone, err := relay(ctx, rdb, js)
	if err != nil {
		return err
	}

	// Count: links in Redis, link events in LINKS.
	inLinks, stored, err := linkEvents(ctx, js)
	if err != nil {
		return err
	}
	count := func(design string) (noEvent, noLink int, err error) {
		for i := range outboxLinks {
			code := fmt.Sprintf("%s%d", design, i)
			n, err := rdb.Exists(ctx, linkKey(design, code)).Result()
			if err != nil {
				return 0, 0, err
			}
			switch {
			case n == 1 && !inLinks[code]:
				noEvent++
			case n == 0 && inLinks[code]:
				noLink++
			}
		}
		return noEvent, noLink, nil
	}
	wpNoEvent, wpNoLink, err := count("wp")
	if err != nil {
		return err
	}
	pwNoEvent, pwNoLink, err := count("pw")
	if err != nil {
		return err
	}
	obNoEvent, obNoLink, err := count("ob")
	if err != nil {
		return err
	}
	crashes := float64(outboxLinks / outboxCrash)
	aborts := float64(outboxLinks / outboxAbort)
	e.exact("naive write→publish: links with no event", "links", crashes, float64(wpNoEvent), "one per crash between the write and the publish")
	e.exact("naive write→publish: events with no link", "events", 0, float64(wpNoLink), "")
	e.exact("naive publish→write: events with no link", "events", aborts, float64(pwNoLink), "one per write that failed after the publish")
	e.exact("naive publish→write: links with no event", "links", 0, float64(pwNoEvent), "")
	e.exact("outbox: links with no event", "links", 0, float64(obNoEvent), "the entry commits with the link; the relay publishes it sooner or later")
	e.exact("outbox: events with no link (rolled back)", "events", 0, float64(obNoLink), "a rolled-back transaction wrote neither link nor entry")
	e.exact("outbox: entries republished after a relay crash", "entries", crashes, float64(redone), "the relay crashed after the publish, before deleting the entry")
	e.exact("outbox: link events stored in LINKS", "events", outboxLinks-aborts, float64(stored["ob"]), "the republished entries were dropped by the duplicate window (same Nats-Msg-Id)")
	e.note("the relay published %d entries (%d twice); LINKS kept one copy of each", relayed, redone)
	return nil
}

// relay drains the outbox like the redirect service's relay: read the oldest
// entries, publish each with its event ID, delete it after the ack. It
// "crashes" (starts over from the oldest entry) after publishing every
// outboxCrash-th entry, before deleting it.
func relay(ctx context.Context, rdb *redis.Client, js jetstream.JetStream) (published, republished int, err error) {
	crashedOn := map[string]bool{}
	for {
		msgs, err := rdb.XRangeN(ctx, outboxKey, "-", "+", 10).Result()
		if err != nil {
			return published, republished, fmt.Errorf("read outbox: %w", err)
		}
		if len(msgs) == 0 {
			return published, republished, nil
		}
		for _, m := range msgs {
			id, _ := m.Values["id"].(string)
			subj, _ := m.Values["subject"].(string)
			data, _ := m.Values["data"].(string)
			msg := nats.NewMsg(subj)
			msg.Data = []byte(data)
			msg.Header.Set(events.HeaderMsgID, id)
			if _, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(events.LinksStream)); err != nil {
				return published, republished, fmt.Errorf("relay %s: %w", id, err)
			}
			published++
			if crashedOn[id] {
				republished++
			} else if published%outboxCrash == 0 {
				crashedOn[id] = true
				break // crashed before XDEL: the next incarnation reads it again
			}
			if err := rdb.XDel(ctx, outboxKey, m.ID).Err(); err != nil {
				return published, republished, fmt.Errorf("delete outbox entry: %w", err)
			}
		}
	}
}

// linkEvents reads LINKS: which codes have a created event, and how many
// events each design's codes have.
func linkEvents(ctx context.Context, js jetstream.JetStream) (map[string]bool, map[string]int, error) {
	c, err := js.OrderedConsumer(ctx, events.LinksStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, nil, fmt.Errorf("read links: %w", err)
	}
	s, err := js.Stream(ctx, events.LinksStream)
	if err != nil {
		return nil, nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, nil, err
	}
	have := map[string]bool{}
	per := map[string]int{}
	for n := uint64(0); n < info.State.Msgs; {
		b, err := c.Fetch(int(min(info.State.Msgs-n, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, nil, err
		}
		got := 0
		for m := range b.Messages() {
			got++
			ev, err := events.DecodeLinkEvent(m.Data())
			if err != nil {
				continue
			}
			have[ev.Code] = true
			per[ev.Code[:2]]++
		}
		if got == 0 {
			return nil, nil, fmt.Errorf("read links: stalled at %d of %d", n, info.State.Msgs)
		}
		n += uint64(got)
	}
	return have, per, nil
}
