package scenario

import (
	"context"
	"errors"
	"time"
)

var errNotYet = errors.New("not written yet")

func notYet(context.Context, *Env) error { return errNotYet }

var (
	thursday     = Scenario{Name: "thursday", Claim: "replay", Lesson: time.Second, run: notYet}
	crashPoints  = Scenario{Name: "crash-points", Claim: "crash", Lesson: time.Second, run: notYet}
	outbox       = Scenario{Name: "outbox", Claim: "outbox", Lesson: time.Second, run: notYet}
	hotPartition = Scenario{Name: "hot-partition", Claim: "hot", Lesson: time.Second, run: notYet}
	repartition  = Scenario{Name: "repartition", Claim: "repartition", Lesson: time.Second, run: notYet}
	backpressure = Scenario{Name: "backpressure", Claim: "bp", Lesson: time.Second, run: notYet}
)
