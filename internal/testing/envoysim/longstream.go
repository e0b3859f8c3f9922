package envoysim

import (
	"bytes"
	"context"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// A long-lived answer (a server-sent event stream that stays open for
// hours) meets Envoy's timers, not the ext_proc server's. DoStream runs
// one on a clock the test writes: each event says how long after the one
// before it arrives, and envoysim never sleeps, so a stream of hours costs
// the test nothing and no result depends on the machine's speed. The
// timers, as FIDELITY.md's "Long-lived answers" rows read them in Envoy:
//
//   - the route timeout runs from the end of the request to the end of
//     the answer, and 0 disables it: router.cc Filter::onRequestComplete
//     arms response_timeout_ only "if (timeout_.global_timeout_.count() >
//     0)"; the route's timeout defaults to 15 s (config_impl.cc,
//     PROTOBUF_GET_MS_OR_DEFAULT(route.route(), timeout,
//     DEFAULT_ROUTE_TIMEOUT_MS)). When it fires, the answer ends there
//     (onResponseTimeout → onUpstreamTimeoutAbort → onUpstreamAbort).
//   - the stream idle timeout restarts on every piece of the answer, and
//     0 disables it: the route's idle_timeout replaces the connection
//     manager's stream_idle_timeout (conn_manager_impl.cc
//     ActiveStream::refreshIdleTimeout, resetIdleTimer, onIdleTimeout).
//   - the ext_proc message timeout runs only while a message awaits its
//     reply (processor_state.cc ProcessorState::onStartProcessorCall
//     arms it, onFinishProcessorCall disarms it): an answer the filter
//     does not process is under no ext_proc timer at all.

// RouteTimeouts are the timers of the matched route that can end a
// long-lived answer.
type RouteTimeouts struct {
	// Timeout is the route's timeout (DefaultRouteTimeout when the route
	// sets none); 0 disables it.
	Timeout time.Duration
	// IdleTimeout is the stream idle timeout in force: the route's
	// idle_timeout when it sets one, else the connection manager's
	// stream_idle_timeout; 0 disables it.
	IdleTimeout time.Duration
}

// Event is one piece of a streamed answer, arriving After the one before
// it (the first: after the request reached the upstream).
type Event struct {
	After time.Duration
	Data  []byte
}

// StreamedAnswer is an upstream's answer whose body arrives over time.
type StreamedAnswer struct {
	Status  int
	Headers []Header
	Events  []Event
	// Ends reports that the upstream ends the answer after its last event;
	// otherwise it is still open then, and the test looks no further.
	Ends bool
}

// StreamUpstream answers a request with a streamed answer, or fails as an
// Upstream does.
type StreamUpstream func(ctx context.Context, req *Request) (*StreamedAnswer, error)

// StreamEnd says how a streamed answer ended for the client.
type StreamEnd uint8

// The endings of a streamed answer.
const (
	// StreamOpen: still open after the last event.
	StreamOpen StreamEnd = iota
	// StreamComplete: the upstream ended it.
	StreamComplete
	// StreamRouteTimeout: the route timeout ended it.
	StreamRouteTimeout
	// StreamIdleTimeout: the stream idle timeout ended it.
	StreamIdleTimeout
	// StreamNotRouted: a local reply answered the request before the
	// router ran (an immediate response, a failed ext_proc phase).
	StreamNotRouted
)

func (e StreamEnd) String() string {
	return [...]string{"open", "complete", "route_timeout", "stream_idle_timeout", "not_routed"}[e]
}

// Delivery is a piece of the answer as the client got it, At a time
// counted from when the request reached the upstream.
type Delivery struct {
	At   time.Duration
	Data []byte
}

// StreamResult is the outcome of DoStream.
type StreamResult struct {
	*Result
	// Delivered is what the client got of the upstream's body, in order:
	// each event at its own time when the filter lets the body pass
	// unprocessed; the whole body at once, at its end, when it holds it;
	// nothing when a local reply took the answer's place.
	Delivered []Delivery
	End       StreamEnd
	// At is when the answer ended, or its last event when still open.
	At time.Duration
}

// timeline walks an answer's events against the route's timers, and
// returns the events that arrived before either fired, how the answer
// ended and when.
func (t RouteTimeouts) timeline(a *StreamedAnswer) ([]Delivery, StreamEnd, time.Duration) {
	var now time.Duration
	var got []Delivery
	for _, ev := range a.Events {
		if t.IdleTimeout > 0 && ev.After >= t.IdleTimeout {
			if idle := now + t.IdleTimeout; t.Timeout == 0 || idle < t.Timeout {
				return got, StreamIdleTimeout, idle
			}
			return got, StreamRouteTimeout, t.Timeout
		}
		now += ev.After
		if t.Timeout > 0 && now >= t.Timeout {
			return got, StreamRouteTimeout, t.Timeout
		}
		got = append(got, Delivery{At: now, Data: ev.Data})
	}
	if a.Ends {
		return got, StreamComplete, now
	}
	return got, StreamOpen, now
}

// passesUnprocessed reports whether the filter leaves the answer alone
// from its headers on: processing ended, or no response phase is sent
// (EncodingProcessorState::noExternalProcess in processor_state.h:
// headers and trailers not sent, body mode NONE). Envoy then forwards
// each piece as it comes.
func (x *exchange) passesUnprocessed() bool {
	m := x.mode
	return x.complete || (!sendHeaders(m.GetResponseHeaderMode()) && !sendTrailers(m.GetResponseTrailerMode()) &&
		m.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_NONE)
}

// DoStream sends req through the filter and the router as Do does, to an
// upstream whose answer streams, under the route's timers t. An answer
// that passes unprocessed reaches the client event by event until a timer
// ends it; one the filter processes is held whole, so the client gets
// nothing of it before its end, and a timer that fires first ends it with
// the local reply the router makes (UpstreamTimeout, or the idle
// timeout's 408) in envoysim: whether Envoy resets the stream instead,
// once the router has passed the headers to the filter, is unconfirmed
// (FIDELITY.md).
func (f *Filter) DoStream(ctx context.Context, req *Request, t RouteTimeouts, up StreamUpstream) *StreamResult {
	x := &exchange{f: f, req: req, res: &Result{}, mode: f.effectiveMode(req)}
	x.reqHeaders = connectionManagerHeaders(req, f.opts)
	x.side.client = f.client
	defer x.side.close()
	out := &StreamResult{Result: x.res, End: StreamNotRouted}
	headers, body, trailers, local, err := x.request(ctx)
	if err != nil || local != nil || ctx.Err() != nil {
		x.res.Response = local
		return out
	}
	pass := x.passesUnprocessed()
	var got []Delivery
	whole := func(ctx context.Context, r *Request) (*Response, error) {
		a, err := up(ctx, r)
		if err != nil {
			return nil, err
		}
		got, out.End, out.At = t.timeline(a)
		resp := &Response{Status: a.Status, Headers: a.Headers}
		switch {
		case pass:
			// Forwarded piece by piece below, past the filter.
		case out.End == StreamRouteTimeout:
			return nil, UpstreamTimeout
		case out.End == StreamIdleTimeout:
			return nil, streamIdleTimeout
		default:
			for _, d := range got {
				resp.Body = append(resp.Body, d.Data...)
			}
		}
		return resp, nil
	}
	resp, err := x.route(ctx, whole, headers, body, trailers)
	if err != nil || ctx.Err() != nil {
		return out
	}
	x.res.Response = resp
	switch {
	case resp.Details != "via_upstream":
		// A local reply: none of the upstream's answer reached the client.
	case pass:
		out.Delivered = got
	case len(resp.Body) > 0:
		out.Delivered = []Delivery{{At: out.At, Data: bytes.Clone(resp.Body)}}
	}
	return out
}

// streamIdleTimeout is the connection manager's reply when the stream
// idle timeout fires before the response headers went downstream
// (ActiveStream::onIdleTimeout: 408 "stream timeout", details
// stream_idle_timeout; Envoy test idle_timeout_integration_test.cc
// PerStreamIdleTimeoutAfterDownstreamHeaders). Its flag,
// StreamIdleTimeout, is CoreResponseFlag 16.
var streamIdleTimeout = &UpstreamFailure{Status: 408, Details: "stream_idle_timeout", Flags: 0x10000,
	Body: "stream timeout"}
