package extproc

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// continueWith answers a message of phase ph with CONTINUE, in the reply
// type that matches the message (Envoy rejects any other as spurious),
// and when mode is non-nil, a processing-mode override. Envoy reads
// overrides only from replies to headers messages.
func continueWith(ph phase, mode *procmodev3.ProcessingMode) *extprocv3.ProcessingResponse {
	type (
		resp         = extprocv3.ProcessingResponse
		reqHeaders   = extprocv3.ProcessingResponse_RequestHeaders
		respHeaders  = extprocv3.ProcessingResponse_ResponseHeaders
		reqBody      = extprocv3.ProcessingResponse_RequestBody
		respBody     = extprocv3.ProcessingResponse_ResponseBody
		reqTrailers  = extprocv3.ProcessingResponse_RequestTrailers
		respTrailers = extprocv3.ProcessingResponse_ResponseTrailers
		headers      = extprocv3.HeadersResponse
		body         = extprocv3.BodyResponse
		trailers     = extprocv3.TrailersResponse
	)
	switch ph {
	case phaseRequestHeaders:
		return reply(mode, func(r *resp, o *reqHeaders, m *headers) { r.Response, o.RequestHeaders = o, m })
	case phaseResponseHeaders:
		return reply(mode, func(r *resp, o *respHeaders, m *headers) { r.Response, o.ResponseHeaders = o, m })
	case phaseRequestBody:
		return reply(mode, func(r *resp, o *reqBody, m *body) { r.Response, o.RequestBody = o, m })
	case phaseResponseBody:
		return reply(mode, func(r *resp, o *respBody, m *body) { r.Response, o.ResponseBody = o, m })
	case phaseRequestTrailers:
		return reply(mode, func(r *resp, o *reqTrailers, m *trailers) { r.Response, o.RequestTrailers = o, m })
	}
	// phaseResponseTrailers: a phase is only ever one of the six.
	return reply(mode, func(r *resp, o *respTrailers, m *trailers) { r.Response, o.ResponseTrailers = o, m })
}

// reply makes a reply in one allocation: every message of every request
// gets one, so the response, its oneof wrapper O and the empty inner
// message M are fields of one value (never copied; the pointers lead into
// it), which link ties together.
func reply[O, M any](mode *procmodev3.ProcessingMode, link func(*extprocv3.ProcessingResponse, *O, *M)) *extprocv3.ProcessingResponse {
	r := new(struct {
		resp  extprocv3.ProcessingResponse
		oneof O
		msg   M
	})
	r.resp.ModeOverride = mode
	link(&r.resp, &r.oneof, &r.msg)
	return &r.resp
}

// skipEverything is the override for a request the server has no further
// interest in. Header modes must be SKIP explicitly, while body modes are
// always copied from an override, so leaving them unset means NONE
// (ext_proc.cc effectiveModeOverride; the mode_override row of
// internal/testing/envoysim/FIDELITY.md).
var skipEverything = skipAllBut(procmodev3.ProcessingMode_SKIP)

// onlyResponseHeaders is the override for a request the server lets go on
// at its headers but whose response gets a header (a shadow decision, a
// key grace period's warning): only the response headers are sent.
var onlyResponseHeaders = skipAllBut(procmodev3.ProcessingMode_SEND)

// skipAllBut skips every phase, the response headers as respHeaders says.
func skipAllBut(respHeaders procmodev3.ProcessingMode_HeaderSendMode) *procmodev3.ProcessingMode {
	const skip, none = procmodev3.ProcessingMode_SKIP, procmodev3.ProcessingMode_NONE
	return &procmodev3.ProcessingMode{RequestHeaderMode: skip, ResponseHeaderMode: respHeaders,
		RequestBodyMode: none, ResponseBodyMode: none, RequestTrailerMode: skip, ResponseTrailerMode: skip}
}

// skipResponseBody is the override, at response headers, for a response
// whose body will not be stored.
var skipResponseBody = &procmodev3.ProcessingMode{
	ResponseBodyMode:    procmodev3.ProcessingMode_NONE,
	ResponseTrailerMode: procmodev3.ProcessingMode_SKIP,
}

// bufferResponseBody asks, at response headers, for the whole response body
// when the filter is configured not to send it.
var bufferResponseBody = &procmodev3.ProcessingMode{
	ResponseBodyMode: procmodev3.ProcessingMode_BUFFERED,
}

// setHeader builds one header mutation. It sets raw_value only: Envoy
// rejects a mutation that sets both value and raw_value, and reads raw_value
// alone (MutationUtils::applyHeaderMutations in mutation_utils.cc). It says
// the same thing twice, so every reader agrees: Envoy's ext_proc reads the
// deprecated BoolValue "append" (default false: overwrite), while later
// code reads append_action when it is not zero; zero is
// APPEND_IF_EXISTS_OR_ADD, so an overwrite must name
// OVERWRITE_IF_EXISTS_OR_ADD explicitly.
func setHeader(name, value string, appendValue bool) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header: &corev3.HeaderValue{Key: name, RawValue: []byte(value)},
		//lint:ignore SA1019 ext_proc still reads the deprecated field (see above).
		Append:       wrapperspb.Bool(appendValue),
		AppendAction: appendAction(appendValue),
	}
}

func appendAction(appendValue bool) corev3.HeaderValueOption_HeaderAppendAction {
	if appendValue {
		return corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
	}
	return corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
}

// headerSet builds the header mutations of one reply, each as setHeader
// would, in a fixed handful of allocations whatever their number: the
// options and their header values are elements of two slices sized once,
// the values' bytes share one buffer, and the two append flags are shared.
// A replay, which carries every stored header, is answered this way.
type headerSet struct {
	opts  []corev3.HeaderValueOption
	vals  []corev3.HeaderValue
	raw   []byte
	flags *[2]wrapperspb.BoolValue // false, true
	list  []*corev3.HeaderValueOption
}

// newHeaderSet makes room for n headers whose values total size bytes.
func newHeaderSet(n, size int) headerSet {
	flags := new([2]wrapperspb.BoolValue)
	flags[1].Value = true
	return headerSet{
		opts:  make([]corev3.HeaderValueOption, 0, n),
		vals:  make([]corev3.HeaderValue, 0, n),
		raw:   make([]byte, 0, size),
		flags: flags,
		list:  make([]*corev3.HeaderValueOption, 0, n),
	}
}

// add appends one mutation; past the room made for, it falls back to
// setHeader.
func (h *headerSet) add(name, value string, appendValue bool) {
	if len(h.opts) == cap(h.opts) {
		h.list = append(h.list, setHeader(name, value, appendValue))
		return
	}
	h.opts, h.vals = h.opts[:len(h.opts)+1], h.vals[:len(h.vals)+1]
	o, v := &h.opts[len(h.opts)-1], &h.vals[len(h.vals)-1]
	start := len(h.raw)
	h.raw = append(h.raw, value...)
	v.Key, v.RawValue = name, h.raw[start:len(h.raw):len(h.raw)]
	o.Header = v
	o.AppendAction = appendAction(appendValue)
	flag := &h.flags[0]
	if appendValue {
		flag = &h.flags[1]
	}
	//lint:ignore SA1019 ext_proc still reads the deprecated field (see setHeader).
	o.Append = flag
	h.list = append(h.list, o)
}

// has reports whether a mutation for name was added already.
func (h *headerSet) has(name string) bool {
	for _, o := range h.list {
		if o.GetHeader().GetKey() == name {
			return true
		}
	}
	return false
}

// immediate builds an immediate response in one allocation: the response,
// its oneof wrapper, the immediate response, its status and header
// mutation are fields of one value (never copied; the pointers lead into
// it). Without headers the mutation is left out: Envoy applies one only
// when present (ext_proc.cc Filter::sendImmediateResponse, has_headers()),
// so an empty one would change nothing.
func immediate(status int, headers []*corev3.HeaderValueOption, body []byte, details string) *extprocv3.ProcessingResponse {
	r := new(struct {
		resp    extprocv3.ProcessingResponse
		oneof   extprocv3.ProcessingResponse_ImmediateResponse
		ir      extprocv3.ImmediateResponse
		status  typev3.HttpStatus
		headers extprocv3.HeaderMutation
	})
	r.status.Code = typev3.StatusCode(status)
	r.headers.SetHeaders = headers
	r.ir.Status, r.ir.Body, r.ir.Details = &r.status, body, details
	if len(headers) > 0 {
		r.ir.Headers = &r.headers
	}
	r.oneof.ImmediateResponse = &r.ir
	r.resp.Response = &r.oneof
	return &r.resp
}

// problemResponse answers with an RFC 9457 problem.
func problemResponse(p *problem.Problem) *extprocv3.ProcessingResponse {
	return problemAnswer(p, p.Status, problem.ContentType, p.Body())
}

// problemAnswer answers p with body, of type contentType, at status, and
// with p's Retry-After.
func problemAnswer(p *problem.Problem, status int, contentType string, body []byte) *extprocv3.ProcessingResponse {
	hs := []*corev3.HeaderValueOption{setHeader("content-type", contentType, false)}
	if ra := p.RetryAfterHeader(); ra != "" {
		hs = append(hs, setHeader("retry-after", ra, false))
	}
	// details becomes the response code details of Envoy's access log.
	return immediate(status, hs, body, "idempotency_"+p.Slug)
}

// Envoy's limits on a header mutation (ext_proc mutation_utils.cc
// MutationUtils::applyHeaderMutations): more set_headers than the header
// map's max_headers_count rejects the whole mutation before any change
// (responseHeaderSizeCheck), and so does a result map with more headers or
// more bytes (keys plus values, HeaderMap::byteSize) than max_headers_count
// and max_request_headers_kb (headerMutationResultCheck). The defaults are
// 100 headers and 60 KiB (Http::DEFAULT_MAX_HEADERS_COUNT,
// DEFAULT_MAX_REQUEST_HEADERS_KB); a replay is kept under them whatever the
// deployment raised them to.
const (
	envoyMaxHeaders     = 100
	envoyMaxHeaderBytes = 60 * 1024
)

// replayBudget is what a replay's stored headers may use: the local reply's
// map also holds :status, and content-length and content-type that
// Utility::prepareLocalReply (http/utility.cc) adds after the mutation, with
// room to spare for the latter's value.
var replayBudget = struct{ headers, bytes int }{
	headers: envoyMaxHeaders - 3,
	bytes:   envoyMaxHeaderBytes - len(":status") - 3 - len("content-length") - 20 - len("content-type") - 256,
}

// replayResponse answers with a stored response. The markers come first,
// so that no later header can keep them from arriving. The first value of
// each stored name overwrites what Envoy's local reply put there (its
// default content-type); later values of the same name are appended, so
// repeated headers come back in their stored order. keep filters the stored
// headers again at replay time, and no header Envoy would refuse (a name
// that is not a token, a value with a control character other than HTAB),
// which would make Envoy drop the whole mutation, idempotent-replayed
// included, is ever replayed, even from a record altered in the store.
// Headers past Envoy's count and size limits are dropped too; dropped says
// how many were.
func replayResponse(r *idem.Response, keep func(name string) bool) (resp *extprocv3.ProcessingResponse, dropped int) {
	size := 2 * len("true")
	for _, h := range r.Headers {
		size += len(h.Value)
	}
	hs := newHeaderSet(len(r.Headers)+2, size)
	// The markers take their share of the budget.
	hs.add(idem.ReplayedHeader, "true", false)
	bytes := len(idem.ReplayedHeader) + len("true")
	if r.BodyOmitted {
		hs.add(idem.BodyOmittedHeader, "true", false)
		bytes += len(idem.BodyOmittedHeader) + len("true")
	}
	for _, h := range r.Headers {
		if r.BodyOmitted && h.Name == "content-type" {
			continue // there is no body to describe
		}
		if !keep(h.Name) || h.Name == idem.ReplayedHeader || h.Name == idem.BodyOmittedHeader {
			continue
		}
		if !safeHeader(h.Name, h.Value) || len(hs.list) >= replayBudget.headers || bytes+len(h.Name)+len(h.Value) > replayBudget.bytes {
			dropped++
			continue
		}
		bytes += len(h.Name) + len(h.Value)
		hs.add(h.Name, h.Value, hs.has(h.Name))
	}
	return immediate(r.Status, hs.list, r.Body, "idempotency_replay_"+strconv.Itoa(r.Status)), dropped
}

// safeHeader reports whether Envoy accepts a header in a mutation as it
// is: a lower-case RFC 9110 token for a name, and a value without control
// characters other than HTAB (HeaderUtility::headerValueIsValid, which is
// nghttp2's nghttp2_check_header_value: DEL is refused too). CR, LF and NUL
// could also split or smuggle a response.
func safeHeader(name, value string) bool {
	badName := func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c))
	}
	badValue := func(c rune) bool { return c != '\t' && (c < 0x20 || c == 0x7f) }
	return name != "" && !strings.ContainsFunc(name, badName) && !strings.ContainsFunc(value, badValue)
}

// wantedResponseBodyMode is the response body mode to restate in an
// override, which always sets both body modes (skipEverything): the one
// in force, or BUFFERED for none.
func wantedResponseBodyMode(m procmodev3.ProcessingMode_BodySendMode) procmodev3.ProcessingMode_BodySendMode {
	if m == procmodev3.ProcessingMode_NONE {
		return procmodev3.ProcessingMode_BUFFERED
	}
	return m
}

// streamedReply is a body phase's CONTINUE carrying sr.
func streamedReply(ph phase, sr *extprocv3.StreamedBodyResponse) *extprocv3.ProcessingResponse {
	resp := continueWith(ph, nil)
	br := resp.GetRequestBody()
	if ph == phaseResponseBody {
		br = resp.GetResponseBody()
	}
	br.Response = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: sr},
	}}
	return resp
}

// echoes reports whether a body mode makes the client forward only what the
// server sends back.
func echoes(m procmodev3.ProcessingMode_BodySendMode) bool {
	return m == procmodev3.ProcessingMode_GRPC || m == procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED
}
