// Package sse writes Server-Sent Events, the text/event-stream format of the
// HTML standard (html.spec.whatwg.org, "Server-sent events"), to one client:
//
//	retry: 2000
//
//	id: 4711
//	event: click
//	data: {"code":"abc123",...}
//
// A browser's EventSource, or any HTTP client, reads the events as they come.
// When the connection drops, the client reconnects after the retry delay and
// sends the last id it received as the Last-Event-ID header, which is how a
// stream resumes without losing or repeating events.
//
// A stream lives much longer than a request, so Open lifts the server's read
// deadline, and every write gets its own deadline (the write timeout): a
// client that stops reading fills the TCP buffers, the next write times out,
// and the stream ends instead of holding memory for it.
package sse

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Event is one event of a stream.
type Event struct {
	// ID becomes the client's Last-Event-ID; empty sends none.
	ID string
	// Name is the event type ("click"); empty is the default "message".
	Name string
	// Data is the payload; line breaks in it become separate data lines.
	Data []byte
}

// Stream is an open event stream. It is not safe for concurrent use: one
// goroutine writes.
type Stream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// flushErr, when w's own Flush cannot fail, is the writer under it
	// whose flush reports the connection's error (see errorFlusher).
	flushErr     interface{ FlushError() error }
	writeTimeout time.Duration
	buf          []byte
	// unflushed counts the events written since the last successful Flush;
	// onSent, if set, is told them when a Flush succeeds.
	unflushed int
	onSent    func(events int)
}

// Open answers the request with 200 and the event-stream headers, tells the
// client to reconnect after retry, and returns the stream. Writes that take
// longer than writeTimeout fail.
func Open(w http.ResponseWriter, retry, writeTimeout time.Duration) (*Stream, error) {
	rc := http.NewResponseController(w)
	// The server's ReadTimeout would otherwise end the stream: once it
	// passes, the connection's background read fails and the request's
	// context is cancelled. A GET has no body left to read.
	if err := rc.SetReadDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return nil, fmt.Errorf("open event stream: %w", err)
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	s := &Stream{w: w, rc: rc, writeTimeout: writeTimeout, flushErr: errorFlusher(w)}
	s.buf = append(s.buf[:0], "retry: "...)
	s.buf = strconv.AppendInt(s.buf, retry.Milliseconds(), 10)
	s.buf = append(s.buf, "\n\n"...)
	if err := s.write(); err != nil {
		return nil, err
	}
	return s, s.Flush()
}

// OnSent has f told, after each successful Flush, how many events (not
// comments) it sent: a count of what reached the connection, never of what
// was only queued for it or lost with a flush that failed.
func (s *Stream) OnSent(f func(events int)) { s.onSent = f }

// Write adds one event to the stream; Flush sends it.
func (s *Stream) Write(e Event) error {
	s.buf = s.buf[:0]
	if e.ID != "" {
		s.buf = appendField(s.buf, "id", []byte(e.ID))
	}
	if e.Name != "" {
		s.buf = appendField(s.buf, "event", []byte(e.Name))
	}
	data := e.Data
	for {
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			break
		}
		s.buf = appendField(s.buf, "data", data[:i])
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	s.buf = appendField(s.buf, "data", data)
	s.buf = append(s.buf, '\n')
	if err := s.write(); err != nil {
		return err
	}
	s.unflushed++
	return nil
}

// Comment writes a comment line, which clients ignore: a heartbeat that keeps
// proxies from closing an idle stream and tells a dead client apart.
func (s *Stream) Comment(text string) error {
	s.buf = append(s.buf[:0], ": "...)
	s.buf = append(s.buf, stripLineBreaks(text)...)
	s.buf = append(s.buf, "\n\n"...)
	return s.write()
}

// Flush sends what was written to the client.
func (s *Stream) Flush() error {
	if err := s.deadline(); err != nil {
		return err
	}
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("flush event stream: %w", err)
	}
	if s.flushErr != nil {
		if err := s.flushErr.FlushError(); err != nil {
			return fmt.Errorf("flush event stream: %w", err)
		}
	}
	if s.onSent != nil && s.unflushed > 0 {
		s.onSent(s.unflushed)
	}
	s.unflushed = 0
	return nil
}

// errorFlusher returns the writer under w whose flush reports a failure,
// or nil when w's own flush does (or none does). echo's Response is an
// http.Flusher, whose Flush returns nothing: it drops the error of the
// net/http writer under it, so a ResponseController over it reports a flush
// that timed out as sent, and the clicks in it were counted though the
// client never got them. The outer Flush still runs first, for any
// wrapper that buffers; the second, with nothing left, returns the
// connection's sticky write error.
func errorFlusher(w http.ResponseWriter) interface{ FlushError() error } {
	if _, ok := w.(interface{ FlushError() error }); ok {
		return nil
	}
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
		if f, ok := w.(interface{ FlushError() error }); ok {
			return f
		}
	}
}

func (s *Stream) write() error {
	if err := s.deadline(); err != nil {
		return err
	}
	if _, err := s.w.Write(s.buf); err != nil {
		return fmt.Errorf("write event stream: %w", err)
	}
	return nil
}

func (s *Stream) deadline() error {
	err := s.rc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("event stream write deadline: %w", err)
	}
	return nil
}

// appendField appends "name: value\n"; value must hold no line break.
func appendField(b []byte, name string, value []byte) []byte {
	b = append(b, name...)
	b = append(b, ": "...)
	b = append(b, stripLineBreaks(string(value))...)
	return append(b, '\n')
}

// stripLineBreaks replaces CR, LF and NUL, which would end a field early or
// (in an id) make the client drop it.
func stripLineBreaks(s string) string {
	if !strings.ContainsAny(s, "\r\n\x00") {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' || r == 0 {
			return ' '
		}
		return r
	}, s)
}

// flushEvery bounds the events Pump writes between flushes while ch stays
// full (a client catching up): the response's buffers send every few
// kilobytes anyway, and a flush tells OnSent what was sent.
const flushEvery = 64

// Pump writes the events from ch until ch is closed, stop is closed, ctx
// ends (the client went away) or a write fails. Events are flushed when ch
// has no more waiting, or flushEvery were written, so a burst goes out in
// few writes. Every tick it
// writes what onTick returns, or a heartbeat comment
// when onTick is nil or returns false. It returns nil when ch is closed or
// stop is closed, the context's error when the client left, and the write
// error otherwise.
func (s *Stream) Pump(ctx context.Context, ch <-chan Event, stop <-chan struct{}, tick time.Duration, onTick func() (Event, bool)) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return nil
		case e, ok := <-ch:
			if !ok {
				return nil
			}
			if err := s.Write(e); err != nil {
				return err
			}
			if len(ch) == 0 || s.unflushed >= flushEvery {
				if err := s.Flush(); err != nil {
					return err
				}
			}
		case <-t.C:
			var err error
			if e, ok := callTick(onTick); ok {
				err = s.Write(e)
			} else {
				err = s.Comment("keepalive")
			}
			if err == nil {
				err = s.Flush()
			}
			if err != nil {
				return err
			}
		}
	}
}

func callTick(f func() (Event, bool)) (Event, bool) {
	if f == nil {
		return Event{}, false
	}
	return f()
}
