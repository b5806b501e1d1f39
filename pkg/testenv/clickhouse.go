package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ClickHouseServer is a clickhouse-server child process (Debian's 18.16 on
// development and CI machines) speaking the native protocol on a free port,
// with its data in a temporary folder.
type ClickHouseServer struct {
	proc process
	// Addr is host:port of the native protocol, stable across restarts.
	Addr string
}

const clickhouseConfig = `<yandex>
  <logger><level>warning</level><log>%[1]s/clickhouse.log</log><errorlog>%[1]s/clickhouse.err.log</errorlog></logger>
  <listen_host>127.0.0.1</listen_host>
  <tcp_port>%[2]d</tcp_port>
  <path>%[1]s/data/</path>
  <tmp_path>%[1]s/tmp/</tmp_path>
  <user_files_path>%[1]s/user_files/</user_files_path>
  <format_schema_path>%[1]s/format_schemas/</format_schema_path>
  <users_config>%[1]s/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>268435456</mark_cache_size>
  <uncompressed_cache_size>268435456</uncompressed_cache_size>
  <max_concurrent_queries>100</max_concurrent_queries>
</yandex>
`

const clickhouseUsers = `<yandex>
  <profiles><default><max_memory_usage>4000000000</max_memory_usage></default></profiles>
  <users><default><password></password><networks><ip>127.0.0.1</ip><ip>::1</ip></networks><profile>default</profile><quota>default</quota></default></users>
  <quotas><default></default></quotas>
</yandex>
`

// WriteClickHouseConfig writes the configuration of a local clickhouse-server
// (native protocol on 127.0.0.1:port, data and logs in dir, user default
// without a password from loopback) into dir, as tests and `snipctl demo`
// run it, and returns the path to give --config-file.
func WriteClickHouseConfig(dir string, port int) (string, error) {
	cfg := filepath.Join(dir, "config.xml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, clickhouseConfig, dir, port), 0o644); err != nil {
		return "", fmt.Errorf("write clickhouse config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(clickhouseUsers), 0o644); err != nil {
		return "", fmt.Errorf("write clickhouse users: %w", err)
	}
	return cfg, nil
}

// NewClickHouseServer starts clickhouse-server with its data in dir.
func NewClickHouseServer(dir string) (*ClickHouseServer, error) {
	bin, err := FindBinary("clickhouse-server", "clickhouse-server")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		cfg, err := WriteClickHouseConfig(dir, port)
		if err != nil {
			return nil, err
		}
		c := &ClickHouseServer{
			Addr: "127.0.0.1:" + strconv.Itoa(port),
			proc: process{
				name: "clickhouse-" + strconv.Itoa(port),
				bin:  bin,
				dir:  dir,
				args: []string{"--config-file=" + cfg},
			},
		}
		if lastErr = c.Start(); lastErr == nil {
			return c, nil
		}
		c.proc.kill()
	}
	return nil, lastErr
}

// StartClickHouse starts a clickhouse-server for one test and stops it at the
// end. Use it when the test stops or freezes ClickHouse; otherwise share one
// per package (Main) and take a database with NewDB.
func StartClickHouse(tb testing.TB) *ClickHouseServer {
	tb.Helper()
	c, err := NewClickHouseServer(tb.TempDir())
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Start starts the server (again) and waits until it answers a ping.
func (c *ClickHouseServer) Start() error {
	if err := c.proc.start(); err != nil {
		return err
	}
	return c.proc.waitReady(60*time.Second, func() error {
		conn, err := c.open("default")
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return conn.Ping(ctx)
	})
}

// Stop shuts ClickHouse down gracefully (18.16 takes 2 to 18 seconds).
func (c *ClickHouseServer) Stop() { c.proc.stop(60 * time.Second) }

// Kill is kill -9.
func (c *ClickHouseServer) Kill() { c.proc.kill() }

// Pause freezes ClickHouse (SIGSTOP), like a hung server; Resume thaws it.
func (c *ClickHouseServer) Pause()  { c.proc.pause() }
func (c *ClickHouseServer) Resume() { c.proc.resume() }

// Close stops the server for good.
func (c *ClickHouseServer) Close() {
	c.proc.resume()
	c.proc.stop(60 * time.Second)
}

func (c *ClickHouseServer) open(database string) (driver.Conn, error) {
	return clickhouse.Open(&clickhouse.Options{
		Addr:         []string{c.Addr},
		Auth:         clickhouse.Auth{Database: database, Username: "default"},
		DialTimeout:  5 * time.Second,
		ReadTimeout:  120 * time.Second,
		MaxOpenConns: 4,
	})
}

// NewDB creates a database of its own for one test, returns a connection to
// it and its name, and drops it when the test ends. The drop gets a long
// timeout: dropping a database after many small inserts is slow on 18.16.
func (c *ClickHouseServer) NewDB(tb testing.TB) (driver.Conn, string) {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "test_" + hex.EncodeToString(b[:])
	admin, err := c.open("default")
	if err != nil {
		tb.Fatalf("testenv: clickhouse open: %v", err)
	}
	if err := admin.Exec(tb.Context(), "CREATE DATABASE "+name); err != nil {
		admin.Close()
		tb.Fatalf("testenv: clickhouse create database %s: %v", name, err)
	}
	conn, err := c.open(name)
	if err != nil {
		admin.Close()
		tb.Fatalf("testenv: clickhouse open %s: %v", name, err)
	}
	tb.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name)
		admin.Close()
	})
	return conn, name
}
