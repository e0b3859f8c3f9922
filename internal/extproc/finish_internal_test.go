package extproc

import (
	"context"
	"testing"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
)

// TestFinishedOnlyWhereEnvoyKeepsTheBody: a stream is ended early only past
// every decision, with nothing owed to a later message, and only in the
// body modes in which Envoy holds the body itself (stream.go, processor.finished). Removing any
// one condition from finished fails a case here.
func TestFinishedOnlyWhereEnvoyKeepsTheBody(t *testing.T) {
	s := New(Config{})
	done := func() *processor {
		p := newProcessor(s, s.cfg.Policies())
		p.stage = stagePassThrough
		p.modesKnown = true
		p.requestBodyMode, p.responseBodyMode = procmodev3.ProcessingMode_BUFFERED, procmodev3.ProcessingMode_BUFFERED
		return p
	}
	if !done().finished() {
		t.Fatal("a passed BUFFERED request with nothing owed is not finished")
	}
	for m, name := range procmodev3.ProcessingMode_BodySendMode_name {
		mode := procmodev3.ProcessingMode_BodySendMode(m)
		want := mode == procmodev3.ProcessingMode_NONE || mode == procmodev3.ProcessingMode_BUFFERED ||
			mode == procmodev3.ProcessingMode_BUFFERED_PARTIAL
		p := done()
		p.requestBodyMode = mode
		if got := p.finished(); got != want {
			t.Errorf("request body mode %s: finished %v, want %v", name, got, want)
		}
		p = done()
		p.responseBodyMode = mode
		if got := p.finished(); got != want {
			t.Errorf("response body mode %s: finished %v, want %v", name, got, want)
		}
	}
	for name, change := range map[string]func(*processor){
		"modes unknown":               func(p *processor) { p.modesKnown = false },
		"reserved, upstream running":  func(p *processor) { p.stage = stageUpstream },
		"response body being read":    func(p *processor) { p.stage = stageResponseBody },
		"request body being read":     func(p *processor) { p.stage = stageRequestBody },
		"a header owed to a response": func(p *processor) { p.respAdd = []attempt.ResponseHeader{{}} },
		"a withheld reply":            func(p *processor) { p.rpc.headersHeld = true },
		"a gRPC call":                 func(p *processor) { p.rpc.call = true },
	} {
		p := done()
		change(p)
		if p.finished() {
			t.Errorf("%s: finished", name)
		}
	}
}

// TestUnsettledIsNotFinished: a settlement the store did not take is
// retried when the stream ends, so the stream is not ended early for it.
func TestUnsettledIsNotFinished(t *testing.T) {
	s := New(Config{})
	for _, unsettled := range []bool{false, true} {
		p := newProcessor(s, s.cfg.Policies())
		p.modesKnown = true
		p.requestBodyMode, p.responseBodyMode = procmodev3.ProcessingMode_BUFFERED, procmodev3.ProcessingMode_BUFFERED
		p.stage, p.phase = stageResponseBody, phaseResponseBody
		p.render(context.Background(), attempt.Verdict{Kind: attempt.Settled, Unsettled: unsettled})
		if p.finished() == unsettled {
			t.Errorf("settled (unsettled %v): finished %v", unsettled, p.finished())
		}
	}
}
