package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
	// A tap on the wire, outside the relay: a plain subscriber on LINKS'
	// subjects sees every publish, the ones the stream drops as duplicates
	// too.
	tap, err := e.Conn("wiretap")
	if err != nil {
		return err
	}
	wire := make(chan *nats.Msg, 4*outboxLinks)
	sub, err := tap.ChanSubscribe(events.LinksSubjects, wire)
	if err != nil {
		return fmt.Errorf("tap links: %w", err)
	}
	defer sub.Unsubscribe()
	if err := tap.Flush(); err != nil {
		return fmt.Errorf("tap links: %w", err)
	}
	if err := relay(ctx, rdb, js); err != nil {
		return err
	}
	// Every publish was acked, so the server had routed it to the tap
	// before: the flush's answer comes after the last of them.
	if err := tap.Flush(); err != nil {
		return fmt.Errorf("tap links: %w", err)
	}
	onWire := map[string]int{} // outbox events by the ID in their payload: publishes seen
	for len(wire) > 0 {
		m := <-wire
		if ev, err := events.DecodeLinkEvent(m.Data); err == nil && strings.HasPrefix(ev.Code, "ob") {
			onWire[ev.ID]++
		}
	}

	// Count: links in Redis, link events in LINKS.
	perCode, err := linkEvents(ctx, js)
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
			case n == 1 && perCode[code] == 0:
				noEvent++
			case n == 0 && perCode[code] > 0:
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
	crashes := float64(outboxLinks / outboxCrash)
	aborts := float64(outboxLinks / outboxAbort)
	e.exact("naive write→publish: links with no event", "links", crashes, float64(wpNoEvent), "one per crash between the write and the publish")
	e.exact("naive write→publish: events with no link", "events", 0, float64(wpNoLink), "")
	e.exact("naive publish→write: events with no link", "events", aborts, float64(pwNoLink), "one per write that failed after the publish")
	e.exact("naive publish→write: links with no event", "links", 0, float64(pwNoEvent), "")

	var s outboxSeen
	for i := range outboxLinks {
		code := fmt.Sprintf("ob%d", i)
		n, err := rdb.Exists(ctx, linkKey("ob", code)).Result()
		if err != nil {
			return err
		}
		switch {
		case n == 1 && perCode[code] == 0:
			s.noEvent++
		case n == 1 && perCode[code] == 1:
			s.once++
		case n == 0 && perCode[code] > 0:
			s.noLink++
		}
		s.links += int(n)
		s.stored += perCode[code]
	}
	for _, n := range onWire {
		s.published += n
		s.twice += n - 1
	}
	outboxChecks(e, s)
	return nil
}

// outboxSeen is what the outbox design left, seen from outside the relay:
// the links in Redis, the events LINKS stored for them, and the publishes
// a subscriber on LINKS' subjects saw.
type outboxSeen struct {
	links     int // links Redis holds
	noEvent   int // links with no event in LINKS
	noLink    int // events in LINKS with no link
	once      int // links with exactly one event in LINKS
	stored    int // events LINKS stored for the outbox's codes
	published int // publishes on the wire
	twice     int // publishes on the wire of an event sent before
}

// outboxChecks judges the outbox design: every link written has exactly one
// event in LINKS, though the relay sent some twice.
func outboxChecks(e *Env, s outboxSeen) {
	crashes := float64(outboxLinks / outboxCrash)
	written := float64(outboxLinks - outboxLinks/outboxAbort)
	e.exact("outbox: links with no event", "links", 0, float64(s.noEvent), "the entry commits with the link; the relay publishes it sooner or later")
	e.exact("outbox: events with no link (rolled back)", "events", 0, float64(s.noLink), "a rolled-back transaction wrote neither link nor entry")
	e.exact("outbox: links written (every 7th rolled back)", "links", written, float64(s.links), "counted in Redis")
	e.exact("outbox: events sent twice (seen on the wire)", "events", crashes, float64(s.twice),
		"a subscriber on LINKS' subjects: the relay crashed after the publish, before deleting the entry, and published it again")
	e.exact("outbox: links with exactly one event in LINKS", "links", written, float64(s.once),
		"the second publish of each carried the same Nats-Msg-Id: the duplicate window dropped it")
	e.note("the wire carried %d publishes of %d outbox events (%d twice); LINKS stored %d", s.published, s.published-s.twice, s.twice, s.stored)
}

// relay drains the outbox like the redirect service's relay: read the oldest
// entries, publish each with its event ID, delete it after the ack. It
// "crashes" (starts over from the oldest entry) after publishing every
// outboxCrash-th entry, before deleting it.
func relay(ctx context.Context, rdb *redis.Client, js jetstream.JetStream) error {
	crashedOn := map[string]bool{}
	published := 0
	for {
		msgs, err := rdb.XRangeN(ctx, outboxKey, "-", "+", 10).Result()
		if err != nil {
			return fmt.Errorf("read outbox: %w", err)
		}
		if len(msgs) == 0 {
			return nil
		}
		for _, m := range msgs {
			id, _ := m.Values["id"].(string)
			subj, _ := m.Values["subject"].(string)
			data, _ := m.Values["data"].(string)
			msg := nats.NewMsg(subj)
			msg.Data = []byte(data)
			msg.Header.Set(events.HeaderMsgID, id)
			if _, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(events.LinksStream)); err != nil {
				return fmt.Errorf("relay %s: %w", id, err)
			}
			published++
			if !crashedOn[id] && published%outboxCrash == 0 {
				crashedOn[id] = true
				break // crashed before XDEL: the next incarnation reads it again
			}
			if err := rdb.XDel(ctx, outboxKey, m.ID).Err(); err != nil {
				return fmt.Errorf("delete outbox entry: %w", err)
			}
		}
	}
}

// linkEvents reads LINKS: how many events it stored for each code.
func linkEvents(ctx context.Context, js jetstream.JetStream) (map[string]int, error) {
	c, err := js.OrderedConsumer(ctx, events.LinksStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("read links: %w", err)
	}
	s, err := js.Stream(ctx, events.LinksStream)
	if err != nil {
		return nil, fmt.Errorf("read links: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read links: %w", err)
	}
	per := map[string]int{}
	for n := uint64(0); n < info.State.Msgs; {
		b, err := c.Fetch(int(min(info.State.Msgs-n, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read links: %w", err)
		}
		got := 0
		for m := range b.Messages() {
			got++
			if ev, err := events.DecodeLinkEvent(m.Data()); err == nil {
				per[ev.Code]++
			}
		}
		if got == 0 {
			return nil, fmt.Errorf("read links: stalled at %d of %d", n, info.State.Msgs)
		}
		n += uint64(got)
	}
	return per, nil
}
