// Package envoysim plays Envoy's side of the ext_proc protocol, so the
// server can be tested through the exact message sequence Envoy's HTTP
// ext_proc filter produces, with no Envoy binary. A Filter is configured
// with the filter's own proto (envoy.extensions.filters.http.ext_proc.v3.
// ExternalProcessor), and a Proxy puts it in front of a real HTTP upstream
// as a loopback net/http server, so tests are HTTP in, HTTP out.
//
// Every behaviour below was read in Envoy's source (envoyproxy/envoy,
// source/extensions/filters/http/ext_proc/, versions 1.34 to main of 2026)
// and its tests (test/extensions/filters/http/ext_proc/). FIDELITY.md is
// the ledger: one row per behaviour, with the Envoy file, function and test,
// the versions, and the test here that pins it. status_on_error exists from
// Envoy 1.36; the early stream close from 1.37 (Options.CloseStreamEarly).
//
//   - One gRPC stream per HTTP request, opened lazily at the first message
//     that must be sent; none when every phase is skipped
//     (ext_proc.cc Filter::openStream).
//   - protocol_config (the body modes in force) on the first message only
//     (ext_proc.cc Filter::encodeProtocolConfig; integration test
//     ProtocolConfigurationEncodingTest).
//   - metadata_context on every message, empty when no namespace is
//     forwarded (Filter::addDynamicMetadata); attributes, keyed
//     "envoy.filters.http.ext_proc", only on the first message of each
//     direction and only when request_attributes / response_attributes are
//     configured (Filter::addAttributes, processor_state.h sendAttributes;
//     test RequestResponseAttributes). CEL integers such as response.flags
//     (a bit vector) travel as numbers (matching_utils.cc
//     ExpressionManager::evaluateAttributes). Only names of Envoy's CEL
//     context (filters/common/expr/context.h) are answered; any other name,
//     source.principal among them, is left out as Envoy leaves it out.
//   - Headers as lower-case keys with raw_value bytes and value empty
//     (mutation_utils.cc MutationUtils::headersToProto, runtime
//     send_header_raw_value); requests carry :authority :path :method
//     :scheme plus x-request-id and x-forwarded-proto added by the
//     connection manager; responses carry :status and
//     x-envoy-upstream-service-time (test utils.cc ignoredHeaders).
//   - HttpHeaders.end_of_stream is true when there is no body; then no body
//     message is sent in any mode (processor_state.cc handleHeaderContinue;
//     tests BufferBodyOverrideGetRequestNoBody, GetBufferedButNoBodies).
//   - BUFFERED: the request headers are held until the body reply; one body
//     message with end_of_stream true, false when trailers follow
//     (processor_state.cc handleHeaderContinue / finalizeBodyResponse,
//     ext_proc.cc onTrailers). A body over the buffer limit is a 413 local
//     reply for requests and a 500 for responses (filter_manager.cc
//     requestDataTooLarge / responseDataTooLarge; test
//     BufferedModeOverSizeRequestLocalReply). See buffered.go; the body
//     phase's dispatch by mode is body.go.
//   - STREAMED: headers continue after their reply; every chunk is sent
//     without waiting and replies are matched in order; only the chunk that
//     ends the stream has end_of_stream true (handleDataStreamedModeBase,
//     handleStreamedBodyResponse; tests PostAndProcessStreamedRequestBody,
//     SendEmptyLastBodyChunk). A body that arrived whole before the headers
//     reply goes as one message (handleCompleteBodyAvailable). See
//     streamed.go.
//   - BUFFERED_PARTIAL: one message of up to the buffer limit, end_of_stream
//     true only if the whole body fitted (handleDataBufferedPartialMode).
//     See partial.go.
//   - mode_override honoured only with allow_mode_override, not with
//     send_body_without_waiting_for_header_response nor FULL_DUPLEX_STREAMED,
//     and only in replies to headers messages (request or response); header
//     modes left DEFAULT keep the filter-level value, body modes are always
//     copied, and allowed_override_modes must match the merged mode
//     (ext_proc.cc onReceiveMessage and effectiveModeOverride,
//     allowed_override_modes_set.h; tests ModeOverrideAllowed,
//     ModeOverrideDisallowed).
//   - Exactly one reply per message, of the message's type; any other reply
//     (or an empty ProcessingResponse) is spurious and fails closed with
//     status_on_error (500) since 1.35 (processor_state.cc
//     handleHeadersResponse "spurious message", onReceiveMessage
//     "unhandled message", runtime ext_proc_fail_close_spurious_resp).
//   - immediate_response ends processing and closes the stream; a missing
//     or <200 status becomes 200; its headers pass the mutation rules; its
//     details become the response code details (Filter::sendImmediateResponse;
//     tests GetAndRespondImmediately*, ...WithBadStatus).
//   - Header mutations: raw_value only (both value and raw_value is an
//     error), only the BoolValue append counts (append_action is not read),
//     host :authority :method :scheme and x-envoy-* ignored by default, more
//     than 100 set headers or a result over 100 headers or 60 KiB rejected,
//     control characters but HTAB refused (mutation_utils.cc
//     applyHeaderMutations; test
//     GetAndRespondImmediatelyWithEnvoyHeaderMutation). An immediate
//     response's content-length and content-type are settled after the
//     mutation, and removed for an empty body (http/utility.cc
//     prepareLocalReply).
//   - A gRPC error from the server gives status_on_error (500), a
//     message_timeout (200 ms) gives 504, and a stream the server closes with
//     OK lets the request continue unprocessed; failure_mode_allow turns the
//     errors into "continue" (Filter::onGrpcError, onMessageTimeout,
//     onGrpcClose; tests GetAndFailStream, RequestMessageTimeout,
//     GetAndCloseStream).
//   - Closing is a half-close followed at once by a reset
//     (filters/common/ext_proc grpc_stream.cc ProcessorStreamImpl::close;
//     test OnlyRequestHeadersResetOnServerMessage).
//   - FULL_DUPLEX_STREAMED: headers, every body chunk and the trailers are
//     sent as they arrive, without waiting for replies (ext_proc.cc onData,
//     handleDataStreamedModeBase: "If the current state is HeadersCallback,
//     stays in that state"; onTrailers); no per-message timer
//     (processor_state.cc onStartProcessorCall); the original body is
//     drained and only the server's streamed_response bodies go on, in any
//     number of body replies, end_of_stream ending the body
//     (handleDuplexStreamedBodyResponse); a plain body mutation, or a body
//     reply before the headers reply, is spurious (handleStreamedBodyCallback,
//     isValidBodyCallbackState); a trailers reply is valid at any time
//     (isValidTrailersCallbackState). See duplex.go.
//   - A local reply to a gRPC request (content-type application/grpc) is a
//     trailers-only response: :status 200, grpc-status from the immediate
//     response's grpc_status or the HTTP code (httpToGrpcStatus), the body
//     as the percent-encoded grpc-message (http/utility.cc
//     Utility::sendLocalReply). See grpc.go.
//   - Envoy's own local replies (upstream timeout or reset, and the local
//     replies of filters after ext_proc: rate limit, local rate limit, RBAC,
//     ext_authz, fault) go through the response phases again since envoy PR
//     #41769 (1.37); 1.34-1.36 skipped them (runtime
//     skip_ext_proc_on_local_reply). Options.SkipLocalReplies selects the
//     older behaviour. Their details and flags are Envoy's (types.go).
//   - A long-lived answer (Filter.DoStream) runs on a clock the test
//     writes, against the route timeout (0 disables it), the stream idle
//     timeout, and no ext_proc timer once no message awaits a reply. See
//     longstream.go.
package envoysim
