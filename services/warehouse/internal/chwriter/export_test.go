package chwriter

import "github.com/snipdev/snip/services/warehouse/internal/loader"

// OnStatement makes w call f with the rows of each INSERT statement the
// server accepted.
func OnStatement(w *Writer, f func(rows []loader.Row)) { w.sent = f }

// Fail is what Insert returns for err.
func Fail(w *Writer, err error) error { return w.fail(err) }
