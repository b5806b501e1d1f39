package jsfeed_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/jsfeed"
)

func setup(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	js := testenv.StartNATS(tb).JetStream(tb)
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	o.Partitions = 4
	if err := topology.Apply(tb.Context(), js, o); err != nil {
		tb.Fatal(err)
	}
	if err := topology.ApplyClickCounter(tb.Context(), js); err != nil {
		tb.Fatal(err)
	}
	return js
}

func run(tb testing.TB, js jetstream.JetStream, h jsfeed.HandleFunc) {
	tb.Helper()
	m, err := jsfeed.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := jsfeed.Feed{Name: "links", Stream: events.LinksStream, Consumer: topology.ClickCounterLinksConsumer,
		Source: "click-counter", Handle: h, MaxRetryDelay: 100 * time.Millisecond}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := f.Run(ctx, js, m); err != nil {
			tb.Errorf("feed: %v", err)
		}
	})
	tb.Cleanup(func() { cancel(); wg.Wait() })
}

func publishLink(tb testing.TB, js jetstream.JetStream, code string, payload []byte) {
	tb.Helper()
	if payload == nil {
		e := events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: events.LinkCreated, Time: time.Now(), Code: code, Owner: "acme"}
		payload, _ = json.Marshal(e)
	}
	if _, err := js.Publish(tb.Context(), events.LinkSubject(events.LinkCreated, code), payload); err != nil {
		tb.Fatal(err)
	}
}

func TestFeedRetriesTransientErrorsAndParksPoison(t *testing.T) {
	t.Parallel()
	js := setup(t)
	var mu sync.Mutex
	got := map[string]int{}
	var fails atomic.Int32
	fails.Store(2)
	run(t, js, jsfeed.Links(func(_ context.Context, es []counter.LinkEvent) error {
		for _, e := range es {
			if e.E.Code == "flaky" && fails.Add(-1) >= 0 {
				return errors.New("redis: connection refused")
			}
		}
		mu.Lock()
		for _, e := range es {
			got[e.E.Code]++
		}
		mu.Unlock()
		return nil
	}))
	publishLink(t, js, "ok", nil)
	publishLink(t, js, "flaky", nil)
	publishLink(t, js, "bad", []byte(`{"v":1,"id":"nope"}`))
	publishLink(t, js, "future", []byte(`{"v":9}`))
	testenv.WaitFor(t, 20*time.Second, "both good events handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["ok"] == 1 && got["flaky"] == 1
	})
	dl, err := js.Stream(t.Context(), events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	for reason, want := range map[string]string{reader.ReasonMalformed: "3", reader.ReasonUnknownVersion: "4"} {
		var msg *jetstream.RawStreamMsg
		testenv.WaitFor(t, 20*time.Second, "a parked "+reason+" event", func() bool {
			msg, err = dl.GetLastMsgForSubject(t.Context(), events.DeadLetterSubject("click-counter", reason))
			return err == nil
		})
		if msg.Header.Get(events.HeaderDeadSeq) != want || msg.Header.Get(events.HeaderDeadSource) != events.LinksStream ||
			msg.Header.Get(events.HeaderDeadReason) != reason {
			t.Errorf("parked %s: headers %v, want seq %s from LINKS", reason, msg.Header, want)
		}
	}
	c, err := js.Consumer(t.Context(), events.LinksStream, topology.ClickCounterLinksConsumer)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "every LINKS event acked", func() bool {
		info, err := c.Info(t.Context())
		return err == nil && info.AckFloor.Stream == 4 && info.NumAckPending == 0
	})
}

func TestClicksFirstSeq(t *testing.T) {
	t.Parallel()
	js := setup(t)
	clicks := jsfeed.Clicks{JS: js}
	first, err := clicks.FirstSeq(t.Context(), 0)
	if err != nil || first != 0 {
		t.Fatalf("empty partition: FirstSeq = %d, %v; want 0", first, err)
	}
	want := map[int]uint64{}
	for i := range 20 {
		code := "c" + string(rune('a'+i))
		ack, err := js.Publish(t.Context(), events.ClickSubject("acme", code), []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		if p := events.Partition(code, 4); want[p] == 0 {
			want[p] = ack.Sequence
		}
	}
	for p, seq := range want {
		got, err := clicks.FirstSeq(t.Context(), p)
		if err != nil || got != seq {
			t.Errorf("partition %d: FirstSeq = %d, %v; want %d", p, got, err, seq)
		}
	}
}
