package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/topology"
)

// cmdTopology applies the topology. An existing stream's retention is not
// shrunk (topology.ErrRetentionShrinks) unless --shrink-retention says the
// operator means it: the server discards what falls outside at once. Nor
// are its replicas lowered (topology.ErrReplicasLowered) unless
// --lower-replicas does.
func cmdTopology(ctx context.Context, env *Env, args []string) error {
	if len(args) < 1 || args[0] != "apply" {
		return fmt.Errorf("topology apply [--shrink-retention] [--lower-replicas]: %w", errUsage)
	}
	fs := flag.NewFlagSet("topology apply", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	shrink := fs.Bool("shrink-retention", false, "lower an existing stream's retention, discarding what falls outside")
	lower := fs.Bool("lower-replicas", false, "scale existing streams down to SNIP_REPLICAS")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("topology apply: %v: topology apply [--shrink-retention] [--lower-replicas]: %w", err, errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("topology apply: unexpected arguments %q: topology apply [--shrink-retention] [--lower-replicas]: %w", fs.Args(), errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	js, closeJS, err := connectJetStream(env)
	if err != nil {
		return err
	}
	defer closeJS()
	o := env.Cfg.Topology.Options()
	o.ShrinkRetention, o.LowerReplicas = *shrink, *lower
	// Each is said as it is applied, so a failure partway leaves the list
	// of what was applied before it.
	o.Applied = func(kind, name, stream string) {
		switch kind {
		case "stream":
			fmt.Fprintf(env.Stdout, "stream %-18s ok\n", name)
		case "consumer":
			fmt.Fprintf(env.Stdout, "consumer %-22s ok (on %s)\n", name, stream)
		default:
			fmt.Fprintf(env.Stdout, "%s %s ok\n", kind, name)
		}
	}
	return topology.Apply(ctx, js, o)
}

// connectJetStream connects once, without natsconn's retry of a failed
// first connect: an operator wants a quick, clear failure ("no servers
// available") when NATS is not there, not every call waiting out
// SNIPCTL_TIMEOUT for a connection that is still being tried. Once
// connected, a lost connection is reconnected as in the services.
func connectJetStream(env *Env) (jetstream.JetStream, func(), error) {
	nc, err := natsconn.Connect(env.Cfg.NATS.Conn("snipctl"), env.Log, nats.RetryOnFailedConnect(false))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return js, nc.Close, nil
}
