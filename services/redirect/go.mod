module github.com/snipdev/snip/services/redirect

go 1.26.0

require github.com/snipdev/snip/pkg v0.0.0

require (
	github.com/boyter/go-string v1.0.5 // indirect
	github.com/caarlos0/env/v11 v11.4.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	github.com/medama-io/go-useragent v1.2.5 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
)

replace github.com/snipdev/snip/pkg => ../../pkg
