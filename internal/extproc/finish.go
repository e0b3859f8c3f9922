package extproc

import (
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// finished reports whether the server needs nothing more of this stream,
// so that it ends it (returns OK) right after the reply it just sent. The
// protocol allows it: every message is answered "or [by] clos[ing] the
// stream", which a server may do "to indicate that no more messages are
// needed" (external_processor.proto, ProcessingRequest.observability_mode
// and the request_headers ... response_trailers members). A stream the
// server closes with OK is one Envoy "can ignore ... for the
// rest of our request and response processing": it sends no further
// message, and a message it had already sent is let through unchanged
// (ext_proc.cc Filter::onGrpcClose: processing_complete_, closeStream,
// clearAsyncState; test GetAndCloseStream in filter_test.cc). grpc-go's
// filter does the same: an io.EOF from the processor bypasses it
// (internal/xds/httpfilter/extproc ext_proc.go, failProcStream,
// triggerBypass). Ending the stream here saves the wait for Envoy's own
// close, and lets grpc-go write the reply and the stream's trailers in one
// write (docs/performance.md, "History of changes").
//
// It holds only when nothing could still be wanted: the request is past
// every decision (stagePassThrough: answered by the server, passed, or its
// record settled), no header waits to be added to the response (respAdd),
// no reply is withheld, the attempt holds nothing and retries nothing at
// the stream's end, the request is not a gRPC call (whose outcome comes
// later, from its trailers: grpc.go), and both body modes are known and
// ones in which Envoy keeps the body itself (NONE, BUFFERED,
// BUFFERED_PARTIAL). In STREAMED, GRPC and FULL_DUPLEX_STREAMED modes
// chunks may be queued on Envoy's side or forwarded only as the server
// sends them back (echoes), and what Envoy does with them on a close was
// not read closely enough to rely on: those streams end as before, when
// Envoy closes them.
func (p *processor) finished() bool {
	return p.stage == stagePassThrough && len(p.respAdd) == 0 && len(p.rpc.held) == 0 && !p.rpc.call &&
		!p.att.Pending() && p.modesKnown && keepsBody(p.requestBodyMode) && keepsBody(p.responseBodyMode)
}

// keepsBody reports a body mode in which Envoy holds the body itself, and
// forwards it unchanged when processing ends.
func keepsBody(m procmodev3.ProcessingMode_BodySendMode) bool {
	switch m {
	case procmodev3.ProcessingMode_NONE, procmodev3.ProcessingMode_BUFFERED, procmodev3.ProcessingMode_BUFFERED_PARTIAL:
		return true
	}
	return false
}
