package scenario

import (
	"bytes"
	"log/slog"
	"testing"
)

// runAt runs a scenario at a high speed and fails the test when a
// measurement is outside its tolerance. Each scenario states its tolerances
// and why next to its checks; the test asserts the same table a user sees.
// A run on a machine too busy for the lesson's premise (INCONCLUSIVE: the
// rows that hold at any speed passed, the others were not judged) is run
// again, up to three runs in all, so the rows that need a machine that keeps
// up get their chance; if none was conclusive, the test passes on the rows
// judged at any speed and says which were not.
func runAt(t *testing.T, name string, speed float64) *Result {
	t.Helper()
	s, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	const runs = 3
	var res *Result
	// The members' warnings (a lease that may have lapsed, a watch that
	// ended) of the last run, printed when it fails or cannot run.
	var log *lockedBuffer
	for i := range runs {
		var err error
		log = &lockedBuffer{}
		res, err = Run(t.Context(), s, Options{Speed: speed, Log: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			t.Fatalf("%v\nthe members' warnings:\n%s", err, log.String())
		}
		if !res.Pass || res.Inconclusive == "" || i == runs-1 {
			break
		}
		t.Logf("%s at speed %g, run %d of %d: %s; running it again", name, speed, i+1, runs, res.Inconclusive)
	}
	var out bytes.Buffer
	Print(&out, res)
	if !res.Pass {
		t.Fatalf("%s at speed %g:\n%s\nthe members' warnings:\n%s", name, speed, out.String(), log.String())
	}
	if len(res.Checks) == 0 {
		t.Fatalf("%s measured nothing", name)
	}
	if res.Inconclusive != "" {
		// The rows that hold at any speed passed; the rows marked -- were
		// not judged in any of the runs.
		t.Logf("%s at speed %g, %d runs: %s; judged only the rows that hold at any speed", name, speed, runs, res.Inconclusive)
	}
	t.Log("\n" + out.String())
	return res
}

func TestKitchen(t *testing.T) {
	t.Parallel()
	runAt(t, "kitchen", 4)
}

func TestRush(t *testing.T) {
	// Not parallel: its numbers are rates, and the other scenarios would
	// take the CPU it measures. The parallel tests start after it.
	runAt(t, "rush", 2)
}

// stopRushWhenMeasured ends the test's rush run once every row is measured
// (rushStopWhenMeasured): the starved runs test the judgement of a starved
// reader, which the rows read from what was measured by then. TestRush runs
// the whole lesson, as `snipctl scenario run rush` does.
func stopRushWhenMeasured(t *testing.T) {
	rushStopWhenMeasured = true
	t.Cleanup(func() { rushStopWhenMeasured = false })
}

// TestRushStarvedFirstHalf runs rush with a log reader held to 140/s in the
// rush's first half and at its 250/s from then on, as a machine busy only
// early in the rush gives it: a correct system passes, whatever the
// reader's pace did during the rush.
func TestRushStarvedFirstHalf(t *testing.T) {
	// Not parallel, as TestRush.
	rushStarvedStart = 140
	t.Cleanup(func() { rushStarvedStart = 0 })
	stopRushWhenMeasured(t)
	runAt(t, "rush", 2)
}

// TestRushStarvedLate runs rush with a log reader at its 250/s until 10 s
// after the rush and held to 170/s from then on, as a machine that gets
// busy while the backlog drains gives it: a correct system passes.
func TestRushStarvedLate(t *testing.T) {
	// Not parallel, as TestRush.
	rushStarvedLate = 170
	t.Cleanup(func() { rushStarvedLate = 0 })
	stopRushWhenMeasured(t)
	runAt(t, "rush", 2)
}

// TestRushStarvedPartition runs rush with the partition of the rush's last
// event held to 30/s from the rush's end until that event is handled, the
// other partitions sharing the reader's 250/s, as a machine whose scheduler
// starves that partition's worker gives it: the event waits for its own
// partition's backlog, not the group's.
func TestRushStarvedPartition(t *testing.T) {
	// Not parallel, as TestRush.
	rushStarvedPartition = 30
	t.Cleanup(func() { rushStarvedPartition = 0 })
	stopRushWhenMeasured(t)
	runAt(t, "rush", 2)
}

func TestSixOfTen(t *testing.T) {
	t.Parallel()
	runAt(t, "six-of-ten", 4)
}

func TestPoison(t *testing.T) {
	t.Parallel()
	runAt(t, "poison", 4)
}

func TestBackpressure(t *testing.T) {
	// Not parallel: its numbers are rates, and the other scenarios would
	// take the CPU it measures. The parallel tests start after it.
	runAt(t, "backpressure", 3)
}

func TestHotPartition(t *testing.T) {
	// Not parallel: its numbers are rates, and the other scenarios would
	// take the CPU it measures. The parallel tests start after it.
	runAt(t, "hot-partition", 4)
}

func TestRepartition(t *testing.T) {
	t.Parallel()
	runAt(t, "repartition", 2)
}

func TestCrashPoints(t *testing.T) {
	t.Parallel()
	runAt(t, "crash-points", 4)
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	runAt(t, "outbox", 4)
}

func TestThursday(t *testing.T) {
	t.Parallel()
	runAt(t, "thursday", 4)
}
