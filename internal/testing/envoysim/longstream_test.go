package envoysim

import (
	"context"
	"fmt"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// keepAlive is an answer of n events, one every gap (an SSE comment line,
// as MCP's listen stream sends in quiet periods), that stays open.
func keepAlive(n int, gap time.Duration) StreamUpstream {
	return func(context.Context, *Request) (*StreamedAnswer, error) {
		a := &StreamedAnswer{Status: 200, Headers: []Header{{"content-type", "text/event-stream"}}}
		for i := range n {
			a.Events = append(a.Events, Event{After: gap, Data: fmt.Appendf(nil, ": %d\n\n", i)})
		}
		return a, nil
	}
}

// onlyRequestPhases is a route's ExtProcPerRoute that keeps the request
// phases and leaves the answer unprocessed.
func onlyRequestPhases() *extprocfilterv3.ExtProcPerRoute {
	return &extprocfilterv3.ExtProcPerRoute{Override: &extprocfilterv3.ExtProcPerRoute_Overrides{
		Overrides: &extprocfilterv3.ExtProcOverrides{ProcessingMode: &extprocfilterv3.ProcessingMode{
			RequestHeaderMode:   extprocfilterv3.ProcessingMode_SEND,
			RequestBodyMode:     extprocfilterv3.ProcessingMode_BUFFERED,
			ResponseHeaderMode:  extprocfilterv3.ProcessingMode_SKIP,
			ResponseBodyMode:    extprocfilterv3.ProcessingMode_NONE,
			RequestTrailerMode:  extprocfilterv3.ProcessingMode_SKIP,
			ResponseTrailerMode: extprocfilterv3.ProcessingMode_SKIP,
		}},
	}}
}

// TestLongStreamTimers: an answer that streams for two hours, one event
// every 30 s, against the route timers. With the route timeout 0 and the
// answer unprocessed it reaches the client event by event, past every
// message timeout; a route timeout ends it; a gap longer than the idle
// timeout ends it; a processed answer is held, so the client gets none of
// it before the route timeout ends it.
func TestLongStreamTimers(t *testing.T) {
	const n, gap = 240, 30 * time.Second
	cfg := RecommendedConfig()
	cfg.MessageTimeout = durationpb.New(300 * time.Millisecond)
	cfg.MaxMessageTimeout = durationpb.New(2500 * time.Millisecond)
	s := &scripted{script: continueAll(nil)}
	f := start(t, s, cfg, Options{})
	for _, tc := range []struct {
		name      string
		per       *extprocfilterv3.ExtProcPerRoute
		timers    RouteTimeouts
		upstream  StreamUpstream
		end       StreamEnd
		at        time.Duration
		delivered int
		phases    []Phase
		status    int
	}{
		{"no route timeout, answer unprocessed", onlyRequestPhases(), RouteTimeouts{IdleTimeout: time.Hour}, keepAlive(n, gap),
			StreamOpen, n * gap, n, []Phase{PhaseRequestHeaders, PhaseRequestBody}, 200},
		{"filter disabled", &extprocfilterv3.ExtProcPerRoute{Override: &extprocfilterv3.ExtProcPerRoute_Disabled{Disabled: true}},
			RouteTimeouts{}, keepAlive(n, gap), StreamOpen, n * gap, n, nil, 200},
		{"route timeout", onlyRequestPhases(), RouteTimeouts{Timeout: 10 * time.Second, IdleTimeout: time.Hour}, keepAlive(n, time.Second),
			StreamRouteTimeout, 10 * time.Second, 9, []Phase{PhaseRequestHeaders, PhaseRequestBody}, 200},
		{"idle timeout", onlyRequestPhases(), RouteTimeouts{IdleTimeout: 20 * time.Second}, keepAlive(n, gap),
			StreamIdleTimeout, 20 * time.Second, 0, []Phase{PhaseRequestHeaders, PhaseRequestBody}, 200},
		{"processed answer", nil, RouteTimeouts{Timeout: 10 * time.Second, IdleTimeout: time.Minute}, keepAlive(n, time.Second),
			StreamRouteTimeout, 10 * time.Second, 0,
			[]Phase{PhaseRequestHeaders, PhaseRequestBody, PhaseResponseHeaders, PhaseResponseBody}, 504},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := post(`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{}}`)
			req.PerRoute = tc.per
			res := f.DoStream(t.Context(), req, tc.timers, tc.upstream)
			if res.End != tc.end || res.At != tc.at || len(res.Delivered) != tc.delivered {
				t.Fatalf("%v at %v with %d events delivered, want %v at %v with %d (%s)",
					res.End, res.At, len(res.Delivered), tc.end, tc.at, tc.delivered, res)
			}
			if got := fmt.Sprint(res.Phases()); got != fmt.Sprint(tc.phases) {
				t.Errorf("phases %s, want %v", got, tc.phases)
			}
			if res.Response == nil || res.Response.Status != tc.status || res.ProcessingError != nil {
				t.Fatalf("response %s, want %d and no processing error", res, tc.status)
			}
			for i, d := range res.Delivered {
				if want := time.Duration(i+1) * gap; tc.timers.Timeout == 0 && d.At != want {
					t.Fatalf("event %d reached the client at %v, want %v: held back", i, d.At, want)
				}
			}
		})
	}
}
