package service_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/snipdev/snip/pkg/service"
)

// A service's Config embeds the blocks it uses and adds its own variables.
type exampleConfig struct {
	service.Base
	service.Redis
	Token     string        `env:"EXAMPLE_TOKEN" secret:"true"`
	BatchSize int           `env:"EXAMPLE_BATCH_SIZE" envDefault:"100"`
	Linger    time.Duration `env:"EXAMPLE_LINGER" envDefault:"1s"`
}

// quietLog is a text log without times, so the examples' output is stable.
func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || len(groups) > 0 { // the time, and the config logged at start
				return slog.Attr{}
			}
			return a
		},
	}))
}

// LoadConfig reads the environment once, over the service's own defaults,
// and names the variable when one is wrong.
func ExampleLoadConfig() {
	defaults := exampleConfig{Base: service.Base{HTTPAddr: ":8099", ShutdownTimeout: 10 * time.Second}}
	validate := func(c *exampleConfig) error {
		if c.BatchSize < 1 {
			return fmt.Errorf("EXAMPLE_BATCH_SIZE %d: want >= 1", c.BatchSize)
		}
		return nil
	}

	cfg, err := service.LoadConfig([]string{"EXAMPLE_BATCH_SIZE=500", "LOG_LEVEL=debug"}, defaults, validate)
	fmt.Println(cfg.HTTPAddr, cfg.BatchSize, cfg.Linger, cfg.LogLevel, cfg.Redis.URL, err)

	_, err = service.LoadConfig([]string{"EXAMPLE_LINGER=soon"}, defaults, validate)
	fmt.Println(err)
	_, err = service.LoadConfig([]string{"EXAMPLE_BATCH_SIZE=0"}, defaults, validate)
	fmt.Println(err)
	// Output:
	// :8099 500 1s DEBUG redis://127.0.0.1:6379/0 <nil>
	// load config: EXAMPLE_LINGER: unable to parse duration: time: invalid duration "soon"
	// load config: EXAMPLE_BATCH_SIZE 0: want >= 1
}

// LogValue logs every variable by its name, with secrets and the passwords
// in URLs masked.
func ExampleLogValue() {
	cfg, _ := service.LoadConfig([]string{"EXAMPLE_TOKEN=hunter2", "REDIS_URL=redis://app:s3cret@redis:6379/0"},
		exampleConfig{Base: service.Base{HTTPAddr: ":8099", ShutdownTimeout: 10 * time.Second}}, nil)
	fmt.Println(service.LogValue(cfg))
	// Output:
	// [log_level=INFO http_addr=:8099 shutdown_timeout=10s shutdown_ready_delay=0s pprof_addr= redis_url=redis://app:***@redis:6379/0 example_token=*** example_batch_size=100 example_linger=1s]
}

// Mask is the one masker of logged configuration.
func ExampleMask() {
	fmt.Println(service.Mask("hunter2", true))
	fmt.Println(service.Mask("nats://app:s3cret@n1:4222,nats://app:s3cret@n2:4222", false))
	fmt.Println(service.Mask("nats://tok3n@n1:4222", false))
	fmt.Println(service.Mask("redis://127.0.0.1:6379/0", false))
	// Output:
	// ***
	// nats://app:***@n1:4222,nats://app:***@n2:4222
	// nats://***@n1:4222
	// redis://127.0.0.1:6379/0
}

// Retry waits for a server at start: it retries failures with backoff, and
// stops at once on an error marked Permanent.
func ExampleRetry() {
	log := slog.New(slog.DiscardHandler)
	tries := 0
	err := service.Retry(context.Background(), log, "connect", func(context.Context) error {
		tries++
		if tries < 3 {
			return errors.New("connection refused")
		}
		return nil
	})
	fmt.Println(tries, err)

	errBadConfig := errors.New("partition count differs from the stream's")
	err = service.Retry(context.Background(), log, "apply topology", func(context.Context) error {
		return service.Permanent(errBadConfig)
	})
	fmt.Println(err, errors.Is(err, errBadConfig))
	// Output:
	// 3 <nil>
	// apply topology: partition count differs from the stream's true
}

// Run runs a service's components until ctx ends or one fails, then stops
// them in stages: intake first, then the work it handed on, then NATS, then
// the stores.
func ExampleRun() {
	cfg := exampleConfig{Base: service.Base{ShutdownTimeout: time.Second}}
	ctx, stop := context.WithCancel(context.Background())
	err := service.Run(ctx, quietLog(), "example", cfg, func(ctx context.Context, g *service.Group) error {
		queue := make(chan int, 10)
		g.Go(service.Intake, "consumer", func(ctx context.Context) error {
			for i := range 3 {
				queue <- i
			}
			<-ctx.Done() // told to stop: take no more
			return nil
		})
		g.Go(service.Work, "worker", func(ctx context.Context) error {
			for done := 0; ; {
				select {
				case <-queue:
					if done++; done == 3 {
						stop() // as SIGTERM would: the example ends once the work is done
					}
				case <-ctx.Done(): // told to stop once the intake has
					fmt.Println("worker stopped after", done, "items")
					return nil
				}
			}
		})
		g.OnStop(service.Work, "flush", func() { fmt.Println("flush what the intake left") })
		g.Close("store", func() error { fmt.Println("store closed"); return nil })
		return nil
	})
	fmt.Println("run:", err)
	// Output:
	// level=INFO msg="starting example"
	// level=INFO msg="stopping example"
	// flush what the intake left
	// worker stopped after 3 items
	// store closed
	// level=INFO msg="example stopped"
	// run: <nil>
}

// The first component that fails stops the others; Run returns its error,
// named.
func ExampleRun_failure() {
	cfg := exampleConfig{Base: service.Base{ShutdownTimeout: time.Second}}
	err := service.Run(context.Background(), slog.New(slog.DiscardHandler), "example", cfg, func(ctx context.Context, g *service.Group) error {
		g.Go(service.Intake, "http", func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		})
		g.Go(service.Intake, "reader", func(context.Context) error {
			return errors.New("stream not found")
		})
		return nil
	})
	fmt.Println(err)
	// Output:
	// reader: stream not found
}

// Main is the whole of a service's main function. The example is compiled,
// not run (it has no Output): Main exits the process. What it does with
// its arguments, environment and run is TestMainHealthcheckAndConfigErrors'
// and TestMainServesPprofOnlyWhenAsked's.
func ExampleMain() {
	load := func(environ, _ []string) (exampleConfig, error) {
		return service.LoadConfig(environ, exampleConfig{Base: service.Base{HTTPAddr: ":8099", ShutdownTimeout: 10 * time.Second}}, nil)
	}
	run := func(ctx context.Context, log *slog.Logger, cfg exampleConfig) error {
		return service.Run(ctx, log, "example", cfg, func(ctx context.Context, g *service.Group) error {
			return nil // open clients, add components
		})
	}
	service.Main("example", load, run)
}
