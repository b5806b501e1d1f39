package reader_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// The owner of a partition records that it carried a rewind out: WaitRewind
// and LatestRewind read that record, and the partition's next owner skips a
// rewind recorded done. A record NATS refused is written again until it is
// in, before the partition goes on. Left unwritten, WaitRewind waited for
// ever for a rewind carried out long ago, and whoever took the partition
// next replayed it a second time (the fraud detector publishing its alerts
// again, past FRAUD's duplicate window).
//
// The member's NATS user may not write the record at first (its publish is
// refused, as one lost in a NATS hiccup would be); once the server has
// refused it, the permission is given back.
func TestARewindRecordRefusedOnceIsWrittenAgain(t *testing.T) {
	t.Parallel()
	const group = "g"
	record := "$KV." + topology.MembersBucket + "." + group + ".rewound.0"
	opts := testenv.NATSOptions(server.RANDOM_PORT, filepath.Join(t.TempDir(), "jetstream"))
	users := func(deny ...string) []*server.User {
		return []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "member", Password: "member", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
			}},
		}
	}
	opts.Users = users(record)
	srv, err := testenv.RunNATSServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	refusals := &violations{}
	srv.SetLoggerV2(refusals, false, false, false)
	url := "nats://" + srv.Addr().String()
	connect := func(user string) jetstream.JetStream {
		nc, err := nats.Connect(url, nats.UserInfo(user, user), nats.MaxReconnects(-1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	admin := connect("admin")
	o := topology.Defaults()
	o.Partitions = 1
	if err := topology.Apply(t.Context(), admin, o); err != nil {
		t.Fatal(err)
	}
	ids := publish(t, admin, 3, 4, 0)

	var handled atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(ctx, connect("member"), reader.Config{Group: group, Member: "m", LeaseTTL: time.Second},
			func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
	}()
	t.Cleanup(func() { cancel(); <-done })
	testenv.WaitFor(t, 30*time.Second, "the first pass", func() bool { return handled.Load() == int64(len(ids)) })

	rctx, rcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer rcancel()
	id, err := reader.Rewind(rctx, admin, group, reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the server to refuse the member's record of the rewind", func() bool {
		return refusals.of(record) > 0
	})
	opts.Users = users()
	if err := srv.ReloadOptions(&opts); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer wcancel()
	if err := reader.WaitRewind(wctx, admin, group, id); err != nil {
		t.Fatalf("the rewind's record, refused once: %v", err)
	}
	testenv.WaitFor(t, 30*time.Second, "the replay", func() bool { return handled.Load() == int64(2*len(ids)) })
}

// violations counts the publish violations a server logs, by subject.
type violations struct {
	mu   sync.Mutex
	logs []string
}

func (v *violations) of(subject string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, l := range v.logs {
		if strings.Contains(l, "Publish Violation") && strings.Contains(l, subject) {
			n++
		}
	}
	return n
}

func (v *violations) Errorf(format string, a ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.logs = append(v.logs, fmt.Sprintf(format, a...))
}

func (v *violations) Noticef(string, ...any) {}
func (v *violations) Warnf(string, ...any)   {}
func (v *violations) Fatalf(string, ...any)  {}
func (v *violations) Debugf(string, ...any)  {}
func (v *violations) Tracef(string, ...any)  {}
