package workload

// browserAgents are the user agents of people, weighted roughly by browser
// share. None of them may look like a bot to the redirect's classifier: the
// oracle checks that humans and bursts are not labelled at the source.
var browserAgents = []weighted{
	{"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36", 30},
	{"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1", 20},
	{"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Mobile Safari/537.36", 18},
	{"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15", 10},
	{"Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:125.0) Gecko/20100101 Firefox/125.0", 7},
	{"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36 Edg/124.0.0.0", 6},
	{"Mozilla/5.0 (Linux; Android 14; SM-S921B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/24.0 Chrome/117.0.0.0 Mobile Safari/537.36", 5},
	{"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36", 4},
}

// BotAgents are well-known crawlers, link unfurlers and HTTP tools: each
// names itself, so a redirect that labels known bots at the source labels
// all of them (the event contract: "Bot is set at the source when the user agent is a
// known bot or link unfurler").
var BotAgents = []string{
	"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
	"Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
	"Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
	"Twitterbot/1.0",
	"Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
	"TelegramBot (like TwitterBot)",
	"curl/8.5.0",
	"python-requests/2.31.0",
}

// referrers are where clicks come from; "" is a click without a Referer
// (typed, from an app, or stripped).
var referrers = []weighted{
	{"", 35},
	{"https://www.google.com/", 15},
	{"https://t.co/", 12},
	{"https://www.reddit.com/r/golang/", 8},
	{"https://news.ycombinator.com/", 8},
	{"https://www.facebook.com/", 7},
	{"https://www.linkedin.com/", 5},
	{"https://duckduckgo.com/", 4},
	{"https://mail.google.com/", 3},
	{"https://example.org/blog/post", 3},
}

// countries are ISO 3166-1 alpha-2 codes, weighted.
var countries = []weighted{
	{"US", 30}, {"DE", 10}, {"GB", 9}, {"IN", 9}, {"FR", 7}, {"BR", 7},
	{"JP", 6}, {"CA", 5}, {"NL", 4}, {"ES", 4}, {"AU", 3}, {"SE", 2},
	{"PL", 2}, {"MX", 2},
}
