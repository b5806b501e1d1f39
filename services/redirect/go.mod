module github.com/snipdev/snip/services/redirect

go 1.26.0

require github.com/snipdev/snip/pkg v0.0.0

require github.com/google/uuid v1.6.0 // indirect

replace github.com/snipdev/snip/pkg => ../../pkg
