package httpapi

import (
	"regexp"
	"strings"
	"testing"

	"github.com/snipdev/snip/pkg/topology"
)

// The "Other consumers" panel says which stream each consumer Apply
// declares reads: it said the click counter's fraud verdicts came from
// FRAUD, while its consumer (the panel's own table shows it) is on
// FRAUD_VERDICTS.
func TestTheConsumersPanelNamesEachConsumersStream(t *testing.T) {
	page, err := webFS.ReadFile("web/index.html")
	if err != nil {
		t.Fatal(err)
	}
	panel := regexp.MustCompile(`(?s)<section id="panel-consumers".*?</p>`).Find(page)
	if panel == nil {
		t.Fatal(`no <section id="panel-consumers"> with a description in index.html`)
	}
	text := strings.Join(strings.Fields(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(string(panel), " ")), " ")
	for _, c := range topology.Consumers() {
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(c.Stream) + `\b`).MatchString(text) {
			t.Errorf("the panel's description does not name stream %s (consumer %s): %q", c.Stream, c.Config.Durable, text)
		}
	}
}
