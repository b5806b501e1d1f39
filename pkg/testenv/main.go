package testenv

import (
	"fmt"
	"os"
	"testing"
)

// Servers are the shared servers a package's TestMain asked for.
type Servers struct {
	Redis        *RedisServer
	ClickHouse   *ClickHouseServer
	RedisCluster *RedisCluster
}

// Option selects a server for Main.
type Option func(*mainConfig)

type mainConfig struct{ redis, clickhouse, redisCluster bool }

// WithRedis asks Main for a shared redis-server.
func WithRedis() Option { return func(c *mainConfig) { c.redis = true } }

// WithClickHouse asks Main for a shared clickhouse-server.
func WithClickHouse() Option { return func(c *mainConfig) { c.clickhouse = true } }

// WithRedisCluster asks Main for a shared Redis Cluster (three masters, three
// replicas). Tests on it take a client with RedisCluster.Client, which
// flushes it, so they must not call t.Parallel.
func WithRedisCluster() Option { return func(c *mainConfig) { c.redisCluster = true } }

// Main starts the servers a package's tests share, runs the tests, stops the
// servers and returns the exit code. A server that cannot start fails the
// whole package with the reason. Use it as:
//
//	var servers *testenv.Servers
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }
func Main(m *testing.M, into **Servers, opts ...Option) int {
	var cfg mainConfig
	for _, o := range opts {
		o(&cfg)
	}
	dir, err := os.MkdirTemp("", "snip-test-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	s := &Servers{}
	if cfg.redis {
		d := dir + "/redis"
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
			return 1
		}
		if s.Redis, err = NewRedisServer(d); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: testenv: %v\n", err)
			return 1
		}
		defer s.Redis.Close()
	}
	if cfg.clickhouse {
		d := dir + "/clickhouse"
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
			return 1
		}
		if s.ClickHouse, err = NewClickHouseServer(d); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: testenv: %v\n", err)
			return 1
		}
		defer s.ClickHouse.Close()
	}
	if cfg.redisCluster {
		if s.RedisCluster, err = NewRedisCluster(dir + "/redis-cluster"); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: testenv: %v\n", err)
			return 1
		}
		defer s.RedisCluster.Close()
	}
	*into = s
	return m.Run()
}
