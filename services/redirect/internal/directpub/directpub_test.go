package directpub_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/redirect/internal/directpub"
)

// TestAckThatCameLateIsAskedForAgain: the nats-server process is frozen
// while a click is published, so its first ack cannot come in time. The
// publisher sends it again with the same Nats-Msg-Id; once the server is
// thawed it stores the first copy and acks the second as a duplicate, and
// PublishClick reports the click stored (before, it reported an error for a
// click that was in CLICKS, which the redirect then answered 503 and
// every reader counted).
func TestAckThatCameLateIsAskedForAgain(t *testing.T) {
	t.Parallel()
	c, err := testenv.NewNATSProcess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	js := c.JetStream(t)
	if err := topology.Apply(t.Context(), js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	nc := c.Connect(t, nats.ReconnectBufSize(-1))
	pjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = time.Second
	p := directpub.New(pjs, timeout)

	id := events.NewID()
	click := events.Click{V: events.ClickVersion, ID: id, Time: time.Now().UTC(), Code: "late", Owner: "o1",
		Target: "https://example.com/", Visitor: "v"}
	data, err := json.Marshal(click)
	if err != nil {
		t.Fatal(err)
	}
	subject := events.ClickSubject(click.Owner, click.Code)

	node := c.Nodes[0]
	node.Pause()
	testenv.WaitFor(t, 5*time.Second, "nats-server stopped", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", node.PID()))
		// The state follows the command name in parentheses: T is stopped.
		return err == nil && strings.Contains(string(b), ") T ")
	})
	// Thawed during the second attempt: the first has timed out by then,
	// and the third leaves a whole timeout of margin on a slow machine.
	thaw := time.AfterFunc(timeout+timeout/2, node.Resume)
	t.Cleanup(func() { thaw.Stop(); node.Resume() })
	start := time.Now()
	if err := p.PublishClick(t.Context(), []byte(id), []byte(subject), data); err != nil {
		t.Fatalf("PublishClick after %s: %v", time.Since(start), err)
	}
	if took := time.Since(start); took < timeout {
		t.Fatalf("stored after %s, before the server was thawed: the test froze nothing", took)
	}
	info, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("CLICKS holds %d messages, want the click once", n)
	}
}

// TestAnAttemptThatTimedOutLeavesTheClickUnconfirmed: the nats-server
// process is frozen while a click is published; the connection goes stale
// (pings unanswered) and is reconnecting by the time the first attempt's
// ack wait ends, so the second attempt fails at once, without reaching any
// server. The first attempt's copy is in the server's socket, and the
// server stores it when it thaws: PublishClick must say the click may be
// stored (ErrUnconfirmed), not report the second attempt's error, which
// says the click was not (the redirect would answer click_not_recorded
// for a click every reader counts).
func TestAnAttemptThatTimedOutLeavesTheClickUnconfirmed(t *testing.T) {
	t.Parallel()
	c, err := testenv.NewNATSProcess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	js := c.JetStream(t)
	if err := topology.Apply(t.Context(), js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	nc := c.Connect(t, nats.ReconnectBufSize(-1), nats.PingInterval(100*time.Millisecond), nats.MaxPingsOutstanding(2))
	pjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = time.Second
	p := directpub.New(pjs, timeout)

	id := events.NewID()
	click := events.Click{V: events.ClickVersion, ID: id, Time: time.Now().UTC(), Code: "stale", Owner: "o1",
		Target: "https://example.com/", Visitor: "v"}
	data, err := json.Marshal(click)
	if err != nil {
		t.Fatal(err)
	}
	subject := events.ClickSubject(click.Owner, click.Code)

	node := c.Nodes[0]
	node.Pause()
	t.Cleanup(node.Resume)
	testenv.WaitFor(t, 5*time.Second, "nats-server stopped", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", node.PID()))
		return err == nil && strings.Contains(string(b), ") T ")
	})
	err = p.PublishClick(t.Context(), []byte(id), []byte(subject), data)
	if nc.IsConnected() {
		t.Fatal("the connection did not go stale while the server was frozen: the test tried nothing")
	}
	node.Resume()
	testenv.WaitFor(t, 10*time.Second, "CLICKS to store the first attempt's copy", func() bool {
		s, err := js.Stream(t.Context(), events.ClicksStream)
		return err == nil && s.CachedInfo().State.Msgs == 1
	})
	if !errors.Is(err, directpub.ErrUnconfirmed) {
		t.Fatalf("PublishClick: %v; want ErrUnconfirmed (the click is in CLICKS)", err)
	}
}
