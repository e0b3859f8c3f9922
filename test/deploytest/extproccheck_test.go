package deploytest

import (
	"errors"
	"fmt"
	"slices"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
)

// The ext_proc filter's name: the key of typed_per_filter_config entries
// and of the Istio patch.
const extProcFilterName = "envoy.filters.http.ext_proc"

// messageTimeoutMargin is the least headroom message_timeout must leave
// above the server's store budget: one store call may take the whole
// budget, and the message still has to be hashed (up to 1 MiB of body),
// sent back and scheduled on a busy node. Below that, a slow Redis shows
// up as Envoy's 504 (and possibly a reservation nobody answers for) instead
// of the server's own 503 problem.
const messageTimeoutMargin = 100 * time.Millisecond

// The attributes the server reads (docs/design.md §4, §7).
// upstream.request_attempt_count is how many times the router sent the
// request upstream (Envoy's CEL context, UpstreamLookupValues, from 1.33:
// changelogs/1.33.0.yaml): the response phase describes only the last
// attempt, so without it a response that follows a router retry looks like
// a first attempt, and one the last attempt never sent could release a key
// whose earlier attempt reached the upstream.
var (
	requiredRequestAttributes  = []string{"xds.route_name"}
	requiredResponseAttributes = []string{"response.code_details", "response.flags", "upstream.request_attempt_count"}
)

// checkExtProc reports every way c differs from what idem-extproc needs
// (docs/design.md §7). It is the one check applied to the filter wherever it is
// configured: plain Envoy, Istio's EnvoyFilter, Envoy Gateway's policy.
func checkExtProc(c *extprocv3.ExternalProcessor) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	pm := c.GetProcessingMode()
	if pm == nil {
		fail("processing_mode is not set: Envoy would send request headers only")
	}
	// Header modes: DEFAULT means SEND. Trailer modes: DEFAULT means SKIP.
	if m := pm.GetRequestHeaderMode(); m != extprocv3.ProcessingMode_SEND && m != extprocv3.ProcessingMode_DEFAULT {
		fail("processing_mode.request_header_mode is %s, want SEND", m)
	}
	if m := pm.GetResponseHeaderMode(); m != extprocv3.ProcessingMode_SEND && m != extprocv3.ProcessingMode_DEFAULT {
		fail("processing_mode.response_header_mode is %s, want SEND", m)
	}
	// Only BUFFERED gives the server the whole body in one message with
	// end_of_stream (the fingerprint needs it, and a stored response must
	// be whole); the others are not supported here.
	if m := pm.GetRequestBodyMode(); m != extprocv3.ProcessingMode_BUFFERED {
		fail("processing_mode.request_body_mode is %s, want BUFFERED", m)
	}
	if m := pm.GetResponseBodyMode(); m != extprocv3.ProcessingMode_BUFFERED {
		fail("processing_mode.response_body_mode is %s, want BUFFERED", m)
	}
	if m := pm.GetRequestTrailerMode(); m != extprocv3.ProcessingMode_SKIP && m != extprocv3.ProcessingMode_DEFAULT {
		fail("processing_mode.request_trailer_mode is %s, want SKIP", m)
	}
	if m := pm.GetResponseTrailerMode(); m != extprocv3.ProcessingMode_SKIP && m != extprocv3.ProcessingMode_DEFAULT {
		fail("processing_mode.response_trailer_mode is %s, want SKIP", m)
	}
	if !c.GetAllowModeOverride() {
		fail("allow_mode_override is false: unprotected requests would pay for every phase")
	}
	if len(c.GetAllowedOverrideModes()) > 0 {
		fail("allowed_override_modes is set: it would refuse the server's skip-everything override")
	}
	if c.GetSendBodyWithoutWaitingForHeaderResponse() {
		fail("send_body_without_waiting_for_header_response is true: Envoy then ignores mode_override")
	}
	if c.GetFailureModeAllow() {
		fail("failure_mode_allow is true: writes would pass unprotected when the server is unreachable")
	}
	if c.GetObservabilityMode() {
		fail("observability_mode is true: Envoy would ignore every answer")
	}
	for _, a := range requiredRequestAttributes {
		if !slices.Contains(c.GetRequestAttributes(), a) {
			fail("request_attributes lacks %s", a)
		}
	}
	for _, a := range requiredResponseAttributes {
		if !slices.Contains(c.GetResponseAttributes(), a) {
			fail("response_attributes lacks %s", a)
		}
	}
	if mt, min := messageTimeout(c), idem.DefaultStoreTimeout+messageTimeoutMargin; mt < min {
		fail("message_timeout is %v, want at least %v (the server's store budget %v plus %v)",
			mt, min, idem.DefaultStoreTimeout, messageTimeoutMargin)
	}
	// The server never asks for more than it believes Envoy grants: an ask
	// above max_message_timeout is ignored, not capped (ext_proc.cc
	// Filter::onNewTimeout, "out of config range. Ignoring the message").
	if m := c.GetMaxMessageTimeout(); m != nil && m.AsDuration() != daemon.DefaultEnvoyMaxMessageTimeout {
		fail("max_message_timeout is %v, and idem-extproc's --envoy-max-message-timeout defaults to %v: make them equal (or pass the flag)",
			m.AsDuration(), daemon.DefaultEnvoyMaxMessageTimeout)
	}
	if s := c.GetStatusOnError(); s != nil && (s.GetCode() < 500 || s.GetCode() > 599) {
		fail("status_on_error is %d: a failed ext_proc call is a server-side failure, want 5xx", s.GetCode())
	}
	if extProcCluster(c) == "" && c.GetGrpcService().GetGoogleGrpc() == nil {
		fail("grpc_service names no cluster")
	}
	return errors.Join(errs...)
}

// messageTimeout is the per-message deadline Envoy applies.
func messageTimeout(c *extprocv3.ExternalProcessor) time.Duration {
	if d := c.GetMessageTimeout(); d != nil {
		return d.AsDuration()
	}
	return envoysim.DefaultMessageTimeout
}

// extProcCluster is the Envoy cluster the filter calls, or "".
func extProcCluster(c *extprocv3.ExternalProcessor) string {
	return c.GetGrpcService().GetEnvoyGrpc().GetClusterName()
}

// maxProtectedLifetime is how long a protected request can take inside
// Envoy, the rule docs/envoy.md states ("A protected request's time in
// Envoy"): the route timeout, one message_timeout for each of the four
// ext_proc messages (request headers and body, response headers and body),
// and one max_message_timeout for the one message the server extends (the
// request's decision, wait included): Envoy restarts that message's timer
// once, when the ask arrives (ext_proc processor_state.cc
// ProcessorState::restartMessageTimer, new_timeout_received_), at most
// message_timeout after the message left.
func maxProtectedLifetime(routeTimeout time.Duration, c *extprocv3.ExternalProcessor) time.Duration {
	return routeTimeout + 4*messageTimeout(c) + c.GetMaxMessageTimeout().AsDuration()
}
