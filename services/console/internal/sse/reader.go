package sse

import (
	"bufio"
	"bytes"
	"io"
	"strings"
)

// Reader reads events from a text/event-stream body, the client side of the
// format: what a Go client of the owners' click stream (and the tests) use.
// Comments and retry lines are skipped.
type Reader struct {
	r *bufio.Reader
}

// NewReader reads events from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next event. At the end of the stream it returns io.EOF
// (an event cut off by the end is dropped, as the standard says).
func (r *Reader) Next() (Event, error) {
	var e Event
	var data bytes.Buffer
	seen := false
	for {
		line, err := r.r.ReadString('\n')
		if err != nil {
			if err == io.EOF {
				return Event{}, io.EOF
			}
			return Event{}, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if !seen {
				continue
			}
			e.Data = bytes.TrimSuffix(data.Bytes(), []byte("\n"))
			return e, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			e.ID, seen = value, true
		case "event":
			e.Name, seen = value, true
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
			seen = true
		}
	}
}
