// Package service is the skeleton every Snip service is built on: what
// main does (the healthcheck subcommand, signals, the log level and the JSON
// log), the configuration blocks services embed (Base, NATS, Redis,
// Topology, Owners) read once from the environment and logged with their
// secrets masked, a named group of components where the first failure stops
// the rest and the stop runs in stated stages, and one retry with backoff
// for waiting on servers at start.
//
// A service's main.go wires only what is its own:
//
//	func main() { service.Main("clickcounter", loadConfig, run) }
//
//	func run(ctx context.Context, log *slog.Logger, cfg Config) error {
//		return service.Run(ctx, log, "clickcounter", cfg, func(ctx context.Context, g *service.Group) error {
//			nc, js, err := g.NATS(cfg.NATS, "clickcounter") // drained in stage 3
//			...
//			g.Go(service.Intake, "http", g.HTTP(web))
//			g.Go(service.Intake, "reader", ...)
//			return nil
//		})
//	}
//
// Run binds HTTP_ADDR before setup, which may wait minutes for NATS, Redis
// or ClickHouse (Retry): meanwhile /healthz answers 200, so a liveness
// probe or the healthcheck subcommand does not restart a process that only
// waits; /readyz answers 503 with what it waits for (the Retry it is in,
// that Retry's last error, the NATS connections that are down); every
// other route answers 503 "starting". Group.HTTP then serves the
// service's routes on the same listener, and calls Base.Ready.
//
// Run stops a service in four stages, each bounded: stop intake (/readyz
// fails at once; HTTP servers, after SHUTDOWN_READY_DELAY, and consumers
// finish and ack what they hold), finish in-flight
// work (buffers written out, background loops), drain NATS within
// SHUTDOWN_TIMEOUT, close the stores. A stop during setup closes the
// listener at once. Tests call run with a Config literal and learn the
// HTTP address from Base.Ready once the routes are served (package
// servicetest), or from Base.Listening once it is bound.
package service
