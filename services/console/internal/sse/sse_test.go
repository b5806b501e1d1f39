package sse_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/services/console/internal/sse"
)

func TestEventsRoundTrip(t *testing.T) {
	t.Parallel()
	events := []sse.Event{
		{ID: "1", Name: "click", Data: []byte(`{"code":"abc"}`)},
		{Data: []byte("two\nlines")},
		{ID: "3\nforged: x", Name: "click", Data: []byte("crlf\r\nand cr\rend")},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := sse.Open(w, time.Second, 5*time.Second)
		if err != nil {
			t.Error(err)
			return
		}
		_ = s.Comment("hello")
		for _, e := range events {
			if err := s.Write(e); err != nil {
				t.Error(err)
			}
		}
		_ = s.Flush()
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
	r := sse.NewReader(resp.Body)
	var got []sse.Event
	for {
		e, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	want := []sse.Event{
		events[0],
		{Data: []byte("two\nlines")},
		// A line break cannot smuggle a field into the id.
		{ID: "3 forged: x", Name: "click", Data: []byte("crlf\nand cr\nend")},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
}

// A stream outlives the server's read and write timeouts: Open lifts the
// read deadline and each write sets its own.
func TestStreamOutlivesServerTimeouts(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := sse.Open(w, time.Second, 5*time.Second)
		if err != nil {
			t.Error(err)
			return
		}
		// Six events half a second apart: the stream lasts past both timeouts.
		ch := make(chan sse.Event)
		go func() {
			defer close(ch)
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for i := range 6 {
				select {
				case ch <- sse.Event{ID: string(rune('a' + i)), Data: []byte("x")}:
				case <-r.Context().Done():
					return
				}
				select {
				case <-tick.C:
				case <-r.Context().Done():
					return
				}
			}
		}()
		_ = s.Pump(r.Context(), ch, nil, time.Hour, nil)
	}))
	srv.Config.ReadTimeout = time.Second
	srv.Config.WriteTimeout = time.Second
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := sse.NewReader(resp.Body)
	for i := range 6 {
		e, err := r.Next()
		if err != nil {
			t.Fatalf("event %d, after %d s of a stream on a server with 1 s timeouts: %v", i, i/2, err)
		}
		if want := string(rune('a' + i)); e.ID != want {
			t.Fatalf("event %d has id %q, want %q", i, e.ID, want)
		}
	}
}

// A client that does not read is cut off by the write timeout: Pump returns
// an error instead of blocking, and nothing waits for the client for ever.
func TestClientThatDoesNotReadIsCutOff(t *testing.T) {
	t.Parallel()
	pumped := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := sse.Open(w, time.Second, 300*time.Millisecond)
		if err != nil {
			pumped <- err
			return
		}
		ch := make(chan sse.Event, 16)
		stop := make(chan struct{})
		go func() {
			payload := []byte(strings.Repeat("x", 16<<10))
			for {
				select {
				case ch <- sse.Event{Data: payload}:
				case <-stop:
					return
				}
			}
		}()
		pumped <- s.Pump(context.Background(), ch, nil, time.Hour, nil)
		close(stop)
	}))
	defer srv.Close()
	// A client with a small receive buffer that never reads the body.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.DialContext(t.Context(), "tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-pumped:
		if err == nil {
			t.Fatal("Pump returned nil for a client that stopped reading, want a write error")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Pump still writing to a client that reads nothing after 60 s")
	}
}

// Behind echo, whose Response.Flush returns nothing, a flush that failed
// reports the failure, and OnSent counts only what reached the client: a
// client that reads after it was cut off gets every event counted. (echo
// dropped the write error of the flush that timed out, so the events in it
// were counted as sent and the next write failed instead.)
func TestFlushBehindEchoReportsTheWriteError(t *testing.T) {
	t.Parallel()
	type result struct {
		pumpErr, flushErr error
		sent              int
	}
	done := make(chan result, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := sse.Open(echo.NewResponse(w, echo.New()), time.Second, 300*time.Millisecond)
		if err != nil {
			done <- result{pumpErr: err}
			return
		}
		var res result
		s.OnSent(func(n int) { res.sent += n })
		ch := make(chan sse.Event, 16)
		stop := make(chan struct{})
		go func() {
			// Small events: the flushes, not the writes, reach the
			// connection, so the write timeout strikes in a flush.
			payload := []byte("x")
			for i := 1; ; i++ {
				select {
				case ch <- sse.Event{ID: strconv.Itoa(i), Name: "n", Data: payload}:
				case <-stop:
					return
				}
			}
		}()
		res.pumpErr = s.Pump(context.Background(), ch, nil, time.Hour, nil)
		close(stop)
		res.flushErr = s.Flush()
		done <- res
	}))
	defer srv.Close()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.DialContext(t.Context(), "tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Pump still writing to a client that reads nothing after 60 s")
	}
	if res.pumpErr == nil {
		t.Fatal("Pump returned nil for a client that stopped reading, want a write error")
	}
	if res.flushErr == nil {
		t.Error("Flush after the connection's write failed returned nil, want the write error")
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := sse.NewReader(resp.Body)
	received := 0
	for {
		e, err := r.Next()
		if err != nil {
			break
		}
		if e.Name == "n" {
			received++
		}
	}
	if res.sent == 0 || res.sent > received {
		t.Errorf("OnSent counted %d events, the client received %d: want at least one, and none counted that did not reach it", res.sent, received)
	}
}
