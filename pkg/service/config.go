package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/topology"
)

// Base is the block every service's Config embeds: how it logs, where its
// HTTP server listens (the service's API, if it has one, and /healthz,
// /readyz, /metrics), and how long each stage of a graceful stop may take.
// HTTP_ADDR and SHUTDOWN_TIMEOUT have a default per service, which the
// service's loadConfig puts in the Config it hands to LoadConfig.
type Base struct {
	// LogLevel is debug, info, warn or error.
	LogLevel slog.Level `env:"LOG_LEVEL" envDefault:"info"`
	// HTTPAddr is the HTTP server's listen address.
	HTTPAddr string `env:"HTTP_ADDR"`
	// ShutdownTimeout bounds each stage of a graceful stop (Run).
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT"`
	// ShutdownReadyDelay is how long the HTTP server keeps taking new
	// connections once the stop has begun, while /readyz answers 503
	// (Group.HTTP): time for a load balancer's readiness probe to take the
	// instance out before its listener closes. 0 closes it at once.
	ShutdownReadyDelay time.Duration `env:"SHUTDOWN_READY_DELAY"`
	// PprofAddr, if set, serves net/http/pprof there (Main only), apart
	// from HTTPAddr: for profiling under load, on a loopback address. Main
	// binds it before run; one it cannot bind stops the start.
	PprofAddr string `env:"PPROF_ADDR"`

	// Listening, if set, is called with the HTTP listener's address once
	// Run has bound it, before setup: from then on /healthz answers 200
	// and /readyz 503, saying what the service waits for (Run).
	Listening func(addr string) `env:"-"`
	// Ready, if set, is called with the HTTP server's address once it
	// serves the service's routes (Group.HTTP): tests run a service on
	// 127.0.0.1:0 and wait for it.
	Ready func(addr string) `env:"-"`
}

func (b Base) base() Base { return b }

// Config is what Main and Run need of a service's configuration: a struct
// that embeds Base.
type Config interface{ base() Base }

// NATS is the block of a service that uses NATS: where, and as whom.
type NATS struct {
	// URL is one or more comma-separated server URLs.
	URL string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	// User and Password, or Creds (a credentials file), authenticate.
	User     string `env:"NATS_USER"`
	Password string `env:"NATS_PASSWORD" secret:"true"`
	Creds    string `env:"NATS_CREDS"`
	// InboxPrefix is the prefix of reply subjects; empty: _INBOX_<User>.
	InboxPrefix string `env:"NATS_INBOX_PREFIX"`

	// Options are extra connection options (tests: a dialer that cuts the
	// connection).
	Options []nats.Option `env:"-"`
	// Connected, if set, is given each connection once made (tests: cut a
	// member off abruptly, as a crash would).
	Connected func(*nats.Conn) `env:"-"`
}

// Conn is the natsconn configuration of a connection named name.
func (n NATS) Conn(name string) natsconn.Config {
	return natsconn.Config{URL: n.URL, Name: name, User: n.User, Password: n.Password, CredsFile: n.Creds, InboxPrefix: n.InboxPrefix}
}

// Redis is the block of a service that uses Redis.
type Redis struct {
	// URL is redis://, rediss:// or redis+cluster:// (pkg/redisconn).
	URL string `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
}

// Topology is the block of a service that applies the JetStream topology at
// start: the same variables as `snipctl topology apply`, so one environment
// file serves both (snipctl ignores SNIP_APPLY_TOPOLOGY: applying is what
// it is asked to do).
type Topology struct {
	// ApplyTopology applies the topology at start (Prepare). False is for a
	// NATS user without stream-admin permissions: `snipctl topology apply`
	// runs first, and the service waits for what it reads.
	ApplyTopology bool `env:"SNIP_APPLY_TOPOLOGY" envDefault:"true"`
	// Partitions is CLICKS' partition count when the stream is created.
	Partitions int `env:"SNIP_PARTITIONS" envDefault:"8"`
	// Replicas is the streams' replication factor: 3 in a NATS cluster.
	Replicas int `env:"SNIP_REPLICAS" envDefault:"1"`
	// ClicksMaxAge is CLICKS' retention; ClicksMaxBytes caps it on disk
	// (-1: no cap).
	ClicksMaxAge   time.Duration `env:"SNIP_CLICKS_MAX_AGE" envDefault:"168h"`
	ClicksMaxBytes int64         `env:"SNIP_CLICKS_MAX_BYTES" envDefault:"-1"`

	// Storage is the streams' storage: file (the zero value); tests use memory.
	Storage jetstream.StorageType `env:"-"`
}

func (t Topology) topologyBlock() Topology { return t }

// check refuses what topology.Apply would, naming the variable.
func (t Topology) check() error {
	switch {
	case t.Partitions < 1 || t.Partitions > topology.MaxPartitions:
		return fmt.Errorf("SNIP_PARTITIONS %d: want 1..%d", t.Partitions, topology.MaxPartitions)
	case t.Replicas < 1 || t.Replicas > topology.MaxReplicas:
		return fmt.Errorf("SNIP_REPLICAS %d: want 1..%d", t.Replicas, topology.MaxReplicas)
	case t.ClicksMaxAge < topology.DefaultClicksDuplicates:
		return fmt.Errorf("SNIP_CLICKS_MAX_AGE %s: want at least CLICKS' duplicate window, %s", t.ClicksMaxAge, topology.DefaultClicksDuplicates)
	case t.ClicksMaxBytes == 0 || t.ClicksMaxBytes < -1:
		return fmt.Errorf("SNIP_CLICKS_MAX_BYTES %d: want more than 0, or -1 for no cap", t.ClicksMaxBytes)
	}
	return nil
}

// Options are the topology.Options the block describes.
func (t Topology) Options() topology.Options {
	o := topology.Defaults()
	o.Partitions, o.Replicas = t.Partitions, t.Replicas
	o.ClicksMaxAge, o.ClicksMaxBytes = t.ClicksMaxAge, t.ClicksMaxBytes
	o.Storage = t.Storage
	return o
}

// LoadConfig reads environ ("KEY=value", as os.Environ returns it) into cfg
// and returns it, after validate (when not nil) accepted it. Every field
// with an env tag is read, in embedded blocks too; a variable that is not
// set keeps the value cfg has, else its envDefault. So a service passes its
// own defaults of HTTP_ADDR and SHUTDOWN_TIMEOUT in cfg. The blocks' own
// values are checked before validate runs: SHUTDOWN_TIMEOUT more than 0,
// SHUTDOWN_READY_DELAY not negative, and a topology that topology.Apply accepts. Errors begin with
// "load config:" and name the variable, not the Go field.
func LoadConfig[C any](environ []string, cfg C, validate func(*C) error) (C, error) {
	var zero C
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: env.ToMap(environ)}); err != nil {
		var pe env.ParseError
		if errors.As(err, &pe) {
			if name, ok := varName(reflect.TypeFor[C](), pe.Name); ok {
				return zero, fmt.Errorf("load config: %s: %w", name, pe.Err)
			}
		}
		return zero, fmt.Errorf("load config: %w", err)
	}
	if err := checkBlocks(cfg); err != nil {
		return zero, fmt.Errorf("load config: %w", err)
	}
	if validate != nil {
		if err := validate(&cfg); err != nil {
			return zero, fmt.Errorf("load config: %w", err)
		}
	}
	return cfg, nil
}

// checkBlocks refuses the values of the blocks cfg embeds that no service
// can run with, naming the variable: a SHUTDOWN_TIMEOUT of 0 or less (every
// stage of the stop would end at once: requests in flight cut, NATS closed
// undrained), and a topology that topology.Apply refuses (retried for ever
// at start otherwise, the service never ready).
func checkBlocks(cfg any) error {
	if b, ok := cfg.(interface{ base() Base }); ok {
		if d := b.base().ShutdownTimeout; d <= 0 {
			return fmt.Errorf("SHUTDOWN_TIMEOUT %s: want more than 0", d)
		}
		if d := b.base().ShutdownReadyDelay; d < 0 {
			return fmt.Errorf("SHUTDOWN_READY_DELAY %s: want 0 or more", d)
		}
	}
	if t, ok := cfg.(interface{ topologyBlock() Topology }); ok {
		return t.topologyBlock().check()
	}
	return nil
}

// varName is the variable of the field named field in t or its blocks, if
// exactly one field has that name.
func varName(t reflect.Type, field string) (string, bool) {
	var found []string
	eachVar(t, func(f reflect.StructField, name string, _ []int) {
		if f.Name == field {
			found = append(found, name)
		}
	})
	if len(found) != 1 {
		return "", false
	}
	return found[0], true
}

// eachVar calls f with every field of struct type t, nested structs
// included, that has an env tag naming a variable, and the field's index.
func eachVar(t reflect.Type, f func(field reflect.StructField, name string, index []int)) {
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			sf := t.Field(i)
			idx := append(index[:len(index):len(index)], i)
			name, _, _ := strings.Cut(sf.Tag.Get("env"), ",")
			switch {
			case name == "-" || !sf.IsExported():
			case name != "":
				f(sf, name, idx)
			case sf.Type.Kind() == reflect.Struct:
				walk(sf.Type, idx)
			}
		}
	}
	walk(t, nil)
}

// LogValue is a configuration as a service logs it at start: every
// variable under its own name in lower case, its value as it would be
// written in the environment, masked by Mask (fields tagged secret:"true"
// are secrets).
func LogValue(cfg any) slog.Value {
	v := reflect.Indirect(reflect.ValueOf(cfg))
	if v.Kind() != reflect.Struct {
		return slog.AnyValue(cfg)
	}
	var attrs []slog.Attr
	eachVar(v.Type(), func(f reflect.StructField, name string, index []int) {
		fv := v.FieldByIndex(index)
		key := strings.ToLower(name)
		switch x := fv.Interface().(type) {
		case time.Duration:
			attrs = append(attrs, slog.Duration(key, x))
		case bool:
			attrs = append(attrs, slog.Bool(key, x))
		case fmt.Stringer:
			attrs = append(attrs, slog.String(key, Mask(x.String(), f.Tag.Get("secret") == "true")))
		default:
			switch fv.Kind() {
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
				attrs = append(attrs, slog.Int64(key, fv.Int()))
			case reflect.Float32, reflect.Float64:
				attrs = append(attrs, slog.Float64(key, fv.Float()))
			default:
				attrs = append(attrs, slog.String(key, Mask(text(fv), f.Tag.Get("secret") == "true")))
			}
		}
	})
	return slog.GroupValue(attrs...)
}

// text is a value as it is written in the environment: a list
// comma-separated.
func text(v reflect.Value) string {
	if v.Kind() == reflect.Slice {
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = text(v.Index(i))
		}
		return strings.Join(parts, ",")
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		return s.String()
	}
	if v.Kind() == reflect.String {
		return v.String()
	}
	return fmt.Sprint(v.Interface())
}

// Mask is how a configuration value appears in a log: a secret as "***"
// (an empty one stays empty, so the log shows whether it is set); any other
// value with the credentials of each URL in it hidden: the password of
// scheme://user:password@host, or the whole token of scheme://token@host.
// It is the one masker of every service's configuration log.
func Mask(value string, secret bool) string {
	switch {
	case value == "":
		return ""
	case secret:
		return "***"
	}
	parts := strings.Split(value, ",")
	for i, p := range parts {
		// After the scheme if there is one: nats.go also takes a URL
		// without one ("app:pass@host:4222").
		start := 0
		if scheme := strings.Index(p, "://"); scheme >= 0 {
			start = scheme + 3
		}
		rest := p[start:]
		// The last '@' of the whole URL, not of its host part alone: a
		// password written with an unescaped '/', '?' or '#' would end the
		// host part early and be shown. An '@' in a path or query masks
		// more than the credentials, never less.
		at := strings.LastIndexByte(rest, '@')
		if at < 0 {
			continue
		}
		user, _, hasPassword := strings.Cut(rest[:at], ":")
		if hasPassword {
			user += ":***"
		} else {
			user = "***"
		}
		parts[i] = p[:start] + user + rest[at:]
	}
	return strings.Join(parts, ",")
}

// Owners is the block of a service with an owner API: owners it ensures
// exist at start (Bootstrap).
type Owners struct {
	// BootstrapOwners is "id:key,..." owners ensured at start (demos, tests).
	BootstrapOwners string `env:"SNIP_BOOTSTRAP_OWNERS" secret:"true"`
}

// Bootstrap ensures that the owners of BootstrapOwners exist with their
// keys, retrying while Redis is away (Retry). A spec that no retry can
// make valid (an entry that is not "id:key", an invalid owner ID, a key
// Ensure refuses: owners.CheckSpec; a key that belongs to another owner:
// owners.ErrKeyTaken) is returned at once, naming the entry by its place,
// not its key.
func (o Owners) Bootstrap(ctx context.Context, log *slog.Logger, store *owners.Store) error {
	if err := owners.CheckSpec(o.BootstrapOwners); err != nil {
		return fmt.Errorf("SNIP_BOOTSTRAP_OWNERS: %w", err)
	}
	return Retry(ctx, log, "bootstrap owners", func(ctx context.Context) error {
		err := store.EnsureFromSpec(ctx, o.BootstrapOwners)
		if errors.Is(err, owners.ErrKeyTaken) {
			return Permanent(fmt.Errorf("SNIP_BOOTSTRAP_OWNERS: %w", err))
		}
		return err
	})
}
