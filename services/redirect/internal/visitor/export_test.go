package visitor

// ParseIsBot is IsBot without its memo, for tests and benchmarks.
var ParseIsBot = parseIsBot
