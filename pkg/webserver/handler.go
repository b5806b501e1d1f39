package webserver

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync/atomic"

	"github.com/labstack/echo/v4"
)

// Handler is the echo instance wrapped once with what every request gets:
// a request ID (the caller's X-Request-Id if it sent a sane one, else a new
// one, echoed in the response header, where handlers read it) and recovery
// from panics (logged with the stack, answered 500).
func (s *Server) Handler() http.Handler {
	return withRequestID(recoverer(s.Echo, s.log))
}

// requestIDs are "<process prefix>-<counter>": unique, cheap, and they sort
// in the order the process saw the requests.
var (
	requestIDPrefix = func() string {
		var b [4]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]) + "-"
	}()
	requestIDCounter atomic.Uint64
)

func newRequestID() string {
	var buf [32]byte
	b := append(buf[:0], requestIDPrefix...)
	b = strconv.AppendUint(b, requestIDCounter.Add(1), 36)
	return string(b)
}

func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(echo.HeaderXRequestID)
		if id == "" || len(id) > 128 {
			id = newRequestID()
		}
		w.Header()[echo.HeaderXRequestID] = []string{id}
		next.ServeHTTP(w, r)
	})
}

func recoverer(next http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			rec := recover()
			if rec == nil {
				return
			}
			if rec == http.ErrAbortHandler {
				panic(rec) // net/http's way to abort a response: let it through
			}
			log.Error("handler panicked", "panic", rec, "path", r.URL.Path,
				"request_id", w.Header().Get(echo.HeaderXRequestID), "stack", string(debug.Stack()))
			w.Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error":{"code":"internal","message":"internal error"}}` + "\n"))
		}()
		next.ServeHTTP(w, r)
	})
}
