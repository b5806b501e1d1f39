package reader

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/testenv"
)

// replyMsg is a delivery with a given reply subject; its Metadata is the
// client's own parse of that subject (nats.Msg.Metadata, the same parser
// jetstream.Msg.Metadata uses).
type replyMsg struct {
	jetstream.Msg
	reply string
}

func (m replyMsg) Reply() string { return m.reply }

func (m replyMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := (&nats.Msg{Reply: m.reply, Sub: &nats.Subscription{}}).Metadata()
	if err != nil {
		return nil, err
	}
	out := &jetstream.MsgMetadata{NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
		Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain}
	out.Sequence.Stream, out.Sequence.Consumer = md.Sequence.Stream, md.Sequence.Consumer
	return out, nil
}

// readMetadata reads every ack subject as the client does: the old form of
// 9 tokens, the form with a domain and account hash (11 tokens, 12 with
// the last token, more ignored), the domain "_" as none, a number that is
// not all digits as 0; and it fails where the client fails.
func TestReadMetadataReadsWhatTheClientReads(t *testing.T) {
	t.Parallel()
	for _, reply := range []string{
		"$JS.ACK.CLICKS.cc-p3.1.4711.42.1764979200123456789.17",
		"$JS.ACK._.ACCHASH.CLICKS.cc-p3.2.4711.42.1764979200123456789.0.tok3n",
		"$JS.ACK.hub.ACCHASH.CLICKS.cc-p3.1.4711.42.1764979200123456789.9",
		"$JS.ACK.hub.ACCHASH.CLICKS.cc-p3.1.4711.42.1764979200123456789.9.tok.more",
		"$JS.ACK.CLICKS.cc-p3.x.47a1.-2..+17",
		"$JS.ACK._.H.S.C.1.18446744073709551615.3.99999999999999999999.1",
		"$JS.ACK.CLICKS.cc-p3.1.4711.42.1764979200123456789",        // 8 tokens
		"$JS.ACK._.H.CLICKS.cc-p3.1.4711.42.1764979200123456789",    // 10 tokens
		"$JS.ACX.CLICKS.cc-p3.1.4711.42.1764979200123456789.17",     // not an ack subject
		"JS.ACK._.ACCHASH.CLICKS.cc-p3.2.4711.42.1764979200123.0.t", // no $
		"",
	} {
		msg := replyMsg{reply: reply}
		want, wantErr := msg.Metadata()
		var got jetstream.MsgMetadata
		err := readMetadata(msg, &got)
		if (err != nil) != (wantErr != nil) {
			t.Errorf("%q: error %v, want %v", reply, err, wantErr)
			continue
		}
		if err == nil && got != *want {
			t.Errorf("%q:\n got %+v\nwant %+v", reply, got, *want)
		}
	}
}

// Reading a delivery's metadata allocates nothing: a batch's are read into
// one slice. (msg.Metadata allocates one value per event.)
func TestReadMetadataAllocatesNothing(t *testing.T) {
	var msg jetstream.Msg = replyMsg{reply: "$JS.ACK._.ACCHASH.CLICKS.cc-p3.2.4711.42.1764979200123456789.0.tok3n"}
	var md jetstream.MsgMetadata
	if n := testing.AllocsPerRun(100, func() { _ = readMetadata(msg, &md) }); n != 0 {
		t.Errorf("readMetadata: %v allocations, want 0", n)
	}
}

// Deliveries from the server the tests run read the same either way.
func TestReadMetadataOfDeliveries(t *testing.T) {
	testenv.Parallel(t)
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "META", Subjects: []string{"meta.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := js.Publish(ctx, fmt.Sprintf("meta.%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "META", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 2; round++ { // the second round redelivered: NumDelivered 2
		mb, err := cons.Fetch(5, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for msg := range mb.Messages() {
			k++
			want, err := msg.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			var got jetstream.MsgMetadata
			if err := readMetadata(msg, &got); err != nil || got != *want {
				t.Errorf("round %d, %s: readMetadata = %+v, %v; msg.Metadata = %+v", round, msg.Reply(), got, err, *want)
			}
			if want.NumDelivered != uint64(round) {
				t.Errorf("round %d: delivered %d times", round, want.NumDelivered)
			}
			if round == 1 {
				_ = msg.Nak()
			}
		}
		if k != 5 {
			t.Fatalf("round %d: %d messages, want 5", round, k)
		}
	}
}

// BenchmarkReadMetadata compares reading a delivery's metadata in place
// with the client's Metadata, which process called for every event before,
// on a message delivered by a server.
//
//	go test -run '^$' -bench ReadMetadata -benchmem ./pkg/reader  # benchstat -col /impl
func BenchmarkReadMetadata(b *testing.B) {
	js := testenv.StartNATS(b).JetStream(b)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "META", Subjects: []string{"meta.>"}}); err != nil {
		b.Fatal(err)
	}
	if _, err := js.Publish(ctx, "meta.1", []byte("x")); err != nil {
		b.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "META", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		b.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("impl=client", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = msg.Metadata()
		}
	})
	b.Run("impl=in-place", func(b *testing.B) {
		b.ReportAllocs()
		var md jetstream.MsgMetadata
		for b.Loop() {
			_ = readMetadata(msg, &md)
		}
	})
}
