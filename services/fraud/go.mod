module github.com/snipdev/snip/services/fraud

go 1.26.0

require github.com/snipdev/snip/pkg v0.0.0

require github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect

replace github.com/snipdev/snip/pkg => ../../pkg
