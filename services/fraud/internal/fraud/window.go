package fraud

// click is one click in a window: where it is in CLICKS and when it
// happened (unix nanoseconds of event time). 16 bytes.
type click struct {
	seq uint64
	at  int64
}

// window holds the clicks of one key in arrival order, oldest first. With a
// limit it keeps only the newest limit clicks (enough to decide "more than
// limit-1 within the window"); without one it keeps what expire leaves.
//
// It is a slice used as a queue: dropping from the front reslices, and the
// next append that outgrows the capacity copies only the live clicks, so the
// memory held is at most about twice the clicks in the window.
type window struct {
	c []click
}

// push appends c, dropping the oldest click when limit > 0 is exceeded.
func (w *window) push(c click, limit int) {
	w.c = append(w.c, c)
	if limit > 0 && len(w.c) > limit {
		w.c = w.c[len(w.c)-limit:]
	}
}

// expire drops the clicks that happened before cutoff.
func (w *window) expire(cutoff int64) {
	i := 0
	for i < len(w.c) && w.c[i].at < cutoff {
		i++
	}
	switch {
	case i == len(w.c):
		w.c = nil // release the array of a key gone quiet
	case i > 0:
		w.c = w.c[i:]
	}
}

func (w *window) len() int { return len(w.c) }

// oldest is the first click; the window must not be empty.
func (w *window) oldest() click { return w.c[0] }

// dropFront drops the n oldest clicks.
func (w *window) dropFront(n int) {
	switch {
	case n >= len(w.c):
		w.c = nil
	case n > 0:
		w.c = w.c[n:]
	}
}
