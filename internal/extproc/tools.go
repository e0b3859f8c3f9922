package extproc

import (
	"log/slog"
	"mime"
	"slices"
	"strings"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/toolhints"
)

// Learning the tools' annotations (tools.protect: unless_hinted): a
// tools/list request passed at its body on a route where such a policy
// may apply has its response body read, and the tools it lists, with
// their readOnlyHint and idempotentHint, are kept in each such policy's
// cache (its tools.protect hints). The response itself goes on unchanged.

// toolsLearning is what a tools/list request carries to its response:
// the policies that learn from it, the upstream it went to, and the
// response body read so far.
type toolsLearning struct {
	pols     []*policy.Policy
	upstream string
	// limit bounds the body read: the largest max_stored_body of pols.
	limit       int
	eventStream bool
	reading     bool
	body        []byte
	// messages counts the body messages read: a rewrite (advertise)
	// replaces a body that came whole in one.
	messages int
}

// learnsFrom returns the learning a request passed at its body starts
// (attempt.Verdict.Learners), or nil when no policy learns from it.
func learnsFrom(bv attempt.Verdict) *toolsLearning {
	if len(bv.Learners) == 0 {
		return nil
	}
	l := &toolsLearning{pols: bv.Learners, upstream: bv.Upstream}
	for _, p := range bv.Learners {
		l.limit = max(l.limit, p.MaxStoredBody)
	}
	return l
}

// partialResponseBody asks, at response headers, for the response body
// in BUFFERED_PARTIAL mode: Envoy sends at most its buffer limit of it,
// with end_of_stream true only if that is the whole body, and lets the
// rest through (ext_proc.cc handleDataBufferedPartialMode; the
// BUFFERED_PARTIAL row of internal/testing/envoysim/FIDELITY.md). A list
// larger than the buffer is then not learned, where BUFFERED would fail
// the response (500, response_payload_too_large).
var partialResponseBody = &procmodev3.ProcessingMode{
	ResponseBodyMode:    procmodev3.ProcessingMode_BUFFERED_PARTIAL,
	ResponseTrailerMode: procmodev3.ProcessingMode_SKIP,
}

// startLearning decides, at the response headers hh of a tools/list
// request being learned from (l), whether its body is read: a 200 answer
// in JSON or as an event stream ("Streamable HTTP", the two forms a POST
// is answered in), in a body mode Envoy lets the server read (mode). The
// reply then asks for it (passThrough, partialResponseBody); otherwise the
// learning is over.
func startLearning(l *toolsLearning, hh *extprocv3.HttpHeaders, mode procmodev3.ProcessingMode_BodySendMode) bool {
	hs := hh.GetHeaders()
	status, _ := headerBytes(hs, ":status")
	ct, _ := headerBytes(hs, "content-type")
	mt, _, err := mime.ParseMediaType(string(ct))
	if string(status) != "200" || err != nil || hh.GetEndOfStream() || echoes(mode) {
		return false
	}
	l.eventStream = mt == "text/event-stream"
	l.reading = l.eventStream || mt == "application/json"
	return l.reading
}

// learnBody reads a response body message of a tools/list being learned
// from, and once the body is whole, learns what it lists. A body over
// the limit, or one the server's body budget has no room for, is not
// learned: its tools stay protected.
func (p *processor) learnBody(body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	l := p.body.tools
	msg := body.GetBody()
	if len(l.body)+len(msg) > l.limit || !p.srv.budget.hold(&p.held, len(msg)) {
		p.body.tools = nil
		p.srv.budget.release(&p.held)
		return p.cont()
	}
	l.body = append(l.body, msg...)
	l.messages++
	if !body.GetEndOfStream() {
		// More chunks follow (STREAMED, where the override was not
		// honoured), or BUFFERED_PARTIAL cut the body at Envoy's buffer
		// and sends no more: only a body seen to its end is learned; the
		// stream's end releases what is held.
		return p.cont()
	}
	p.body.tools = nil
	p.srv.budget.release(&p.held)
	listing, ok := toolhints.ParseResponse(l.body, l.eventStream)
	if !ok {
		p.att.LogAt(slog.LevelDebug, "a tools/list answer lists no tools; nothing learned")
		return p.cont()
	}
	now := p.srv.cfg.Now()
	for _, pol := range l.pols {
		ttl := pol.Tools.Hints.DefaultTTL()
		if listing.HasTTL {
			ttl = listing.TTL
		}
		pol.Tools.Hints.Learn(l.upstream, listing.Tools, ttl, now)
	}
	p.att.LogAt(slog.LevelDebug, "tools' annotations learned",
		slog.Int("tools", len(listing.Tools)), slog.String("upstream", strings.TrimSpace(l.upstream)))
	if out := advertised(l, now); out != nil {
		p.rpc.release = releaseAll
		return out
	}
	return p.cont()
}

// advertised is the body reply that rewrites a tools/list answer read whole, in one message, as
// JSON, for the policies that advertise (tools.advertise_idempotent):
// idempotentHint: true on every tool one of them protects
// (toolhints.Advertise). The body reply also removes content-length,
// which Envoy keeps on the held headers: in BUFFERED it refuses a mutated
// body whose length differs from it, and in BUFFERED_PARTIAL, the mode
// asked for here, it applies the mutation without looking, so a stale
// length would reach the agent; a header mutation in the same reply is
// applied first (processor_state.cc, ProcessorState::handleBodyResponse).
// An event stream, or a body in several messages, goes on unchanged.
func advertised(l *toolsLearning, now time.Time) *extprocv3.ProcessingResponse {
	advertises := func(pol *policy.Policy) bool { return pol.Tools.AdvertiseIdempotent }
	if l.eventStream || l.messages != 1 || !slices.ContainsFunc(l.pols, advertises) {
		return nil
	}
	out, ok := toolhints.Advertise(l.body, func(name string) bool {
		return slices.ContainsFunc(l.pols, func(pol *policy.Policy) bool { return advertises(pol) && pol.ProtectsTool(l.upstream, name, now) })
	})
	if !ok {
		return nil
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: []string{"content-length"}},
			BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}},
		}},
	}}
}
