module github.com/snipdev/snip/loadtest

go 1.26.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/google/uuid v1.6.0
	github.com/snipdev/snip/pkg v0.0.0
	golang.org/x/sync v0.25.0
)

replace github.com/snipdev/snip/pkg => ../pkg
