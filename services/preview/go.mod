module github.com/snipdev/snip/services/preview

go 1.26.0

require github.com/snipdev/snip/pkg v0.0.0

require (
	github.com/google/go-cmp v0.7.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace github.com/snipdev/snip/pkg => ../../pkg
