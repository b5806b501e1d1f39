// Package link is what a short link is and what makes one valid: the target
// URL rules, the custom-code rules, and the generator of random codes.
//
// Everything here is pure (no I/O), so the rules are unit- and fuzz-tested on
// their own and the HTTP layer only translates the sentinel errors of
// errors.go into status codes.
package link
