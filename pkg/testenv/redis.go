package testenv

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisDatabases is how many logical databases the test server has, so that
// every test of a package can have its own.
const redisDatabases = 4096

// RedisServer is a redis-server child process with its data in a temporary
// folder. AOF persistence is on (fsync every second), so Stop and Start keep
// the data, as a production restart would.
type RedisServer struct {
	proc process
	// Addr is host:port, stable across restarts.
	Addr string

	mu     sync.Mutex
	nextDB int
}

// NewRedisServer starts redis-server with its data in dir. Prefer StartRedis
// in a test and Main in TestMain; this is for both of them and for tools.
func NewRedisServer(dir string) (*RedisServer, error) { return newRedisServer(dir, nil) }

// newRedisServer starts redis-server with extra arguments; extra may use
// the placeholder portArg, replaced by a free port of its own.
func newRedisServer(dir string, extra []string) (*RedisServer, error) {
	bin, err := FindBinary("redis-server", "redis-server")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 { // retry if another process takes the port first
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		r := &RedisServer{
			Addr:   "127.0.0.1:" + strconv.Itoa(port),
			nextDB: 1,
			proc: process{
				name: "redis-" + strconv.Itoa(port),
				bin:  bin,
				dir:  dir,
				args: append(RedisArgs(port, dir),
					"--databases", strconv.Itoa(redisDatabases),
					"--maxclients", "4000",
				),
			},
		}
		for _, a := range extra {
			if a == portArg {
				p, err := FreePort()
				if err != nil {
					return nil, err
				}
				a = strconv.Itoa(p)
			}
			r.proc.args = append(r.proc.args, a)
		}
		if lastErr = r.Start(); lastErr == nil {
			return r, nil
		}
		r.proc.kill()
	}
	return nil, lastErr
}

// RedisArgs are redis-server's arguments for a local server on 127.0.0.1:port
// with its data in dir, as tests and `snipctl demo` run it: no snapshots,
// the append-only file synced every second (so a stop and a start keep the
// data, as a production restart would).
func RedisArgs(port int, dir string) []string {
	return []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--save", "",
		"--appendonly", "yes",
		"--appendfsync", "everysec",
	}
}

// StartRedis starts a redis-server for one test and stops it at the end.
// Use it when the test kills or restarts Redis; otherwise share one server
// per package (Main) and take a database with NewDB.
func StartRedis(tb testing.TB) *RedisServer {
	tb.Helper()
	r, err := NewRedisServer(tb.TempDir())
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(r.Close)
	return r
}

// Start starts the server (again) and waits until it answers PING.
func (r *RedisServer) Start() error {
	if err := r.proc.start(); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	return r.proc.waitReady(20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	})
}

// Stop shuts Redis down gracefully (it writes the AOF out first).
func (r *RedisServer) Stop() { r.proc.stop(20 * time.Second) }

// Kill is kill -9: whatever the last fsync did not cover is lost.
func (r *RedisServer) Kill() { r.proc.kill() }

// Pause freezes Redis (SIGSTOP); Resume thaws it.
func (r *RedisServer) Pause()  { r.proc.pause() }
func (r *RedisServer) Resume() { r.proc.resume() }

// PID is the server's process ID (0 when stopped), for tools that signal it
// themselves, as an operator would (the load test's chaos suite).
func (r *RedisServer) PID() int { return r.proc.pid() }

// Close stops the server for good.
func (r *RedisServer) Close() {
	r.proc.resume()
	r.proc.stop(10 * time.Second)
}

// NewDB reserves a fresh logical database for one test, returns a client on
// it, and flushes and closes it when the test ends.
func (r *RedisServer) NewDB(tb testing.TB) (*redis.Client, int) {
	tb.Helper()
	r.mu.Lock()
	db := r.nextDB
	r.nextDB++
	r.mu.Unlock()
	if db >= redisDatabases {
		tb.Fatalf("testenv: redis: out of databases (%d)", redisDatabases)
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr, DB: db})
	if err := c.FlushDB(tb.Context()).Err(); err != nil {
		tb.Fatalf("testenv: redis flush db %d: %v", db, err)
	}
	tb.Cleanup(func() {
		_ = c.FlushDB(context.Background()).Err()
		_ = c.Close()
	})
	return c, db
}

// URL is a redis:// URL for database db, as services take it in REDIS_URL.
func (r *RedisServer) URL(db int) string {
	return fmt.Sprintf("redis://%s/%d", r.Addr, db)
}

// Running reports whether the server's process is running.
func (r *RedisServer) Running() bool { return !r.proc.exited() }
