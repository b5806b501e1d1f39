package delivery_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/webhooks/internal/delivery"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
)

func TestClickInterest(t *testing.T) {
	t.Parallel()
	click, alert := []string{endpoint.TypeClick}, []string{endpoint.TypeFraudAlert}
	eps := []endpoint.Endpoint{
		{Owner: "acme", Types: click, Links: []string{"a1"}},
		{Owner: "acme", Types: click},                             // every link: wins over a1
		{Owner: "acme", Types: click, Links: []string{"a2"}},      // still every link
		{Owner: "bob", Types: click, Links: []string{"b1"}},       //
		{Owner: "bob", Types: click, Links: []string{"b2", "b1"}}, // both codes
		{Owner: "carol", Types: alert},                            // no clicks
		{Owner: "dave", Types: click, DisabledAt: time.Now()},     // disabled: nothing
		{Owner: "erin", Types: click, Paused: true},               // paused keeps queueing
	}
	got := delivery.ClickInterest(eps)
	want := topology.Interest{"acme": nil, "bob": {"b1", "b2", "b1"}, "erin": nil}
	if !maps.EqualFunc(got, want, func(a, b []string) bool { return (a == nil) == (b == nil) && slices.Equal(a, b) }) {
		t.Errorf("ClickInterest = %v, want %v", got, want)
	}
	if got := delivery.ClickInterest(nil); got == nil || len(got) != 0 {
		t.Errorf("no endpoints: %v, want an empty (not nil: nil is everything) interest", got)
	}
}
