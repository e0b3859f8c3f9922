// Package extproc is the Envoy ext_proc gRPC server. It reads Envoy's facts
// out of the protocol's phases (request headers, request body, response
// headers, response body, end of stream), hands them to one attempt
// (package attempt: admit, decide, settle), and renders the attempt's
// verdicts as ext_proc replies for the phase and the caller (HTTP, gRPC,
// JSON-RPC): CONTINUE, a processing-mode override, or an immediate
// response (render.go). It decides nothing itself.
//
// One gRPC stream carries one HTTP request; everything known about that
// request lives in one processor value owned by its stream, which holds
// the request's attempt. The stream loop (serve) is the only place that
// sends on the stream: a phase's replies are queued and sent in protocol
// order.
package extproc

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Config configures a Server.
type Config struct {
	Store idem.Store
	// Policies returns the policies in force; it is called once per stream,
	// so a reload applies to new streams and never to one in progress.
	Policies func() *policy.Set
	Logger   *slog.Logger
	// StoreTimeout bounds each store call; idem.DefaultStoreTimeout when zero.
	StoreTimeout time.Duration
	// MaxMessageTimeout is the filter's max_message_timeout
	// (attempt.Server); zero when unknown.
	MaxMessageTimeout time.Duration
	// Homes finds the store of a scope homed in another region (package
	// region); nil when every key lives in Store.
	Homes attempt.HomeFinder
	// SendHome names the regions a request homed there is sent to
	// through Envoy (attempt.Server.SendHome, HomeHeader).
	SendHome []string
	// SettleAtEndTimeout bounds the store call that settles a record after its
	// stream ended; it runs while no one waits, so it may be longer.
	// DefaultSettleAtEndTimeout when zero.
	SettleAtEndTimeout time.Duration
	// Observer is told every decision; none when nil.
	Observer idem.Observer
	// EnvoyObserver is told what the server notices of Envoy's side; none
	// when nil.
	EnvoyObserver EnvoyObserver
	// TracerProvider makes the spans of each stream; none when nil.
	TracerProvider trace.TracerProvider
	// Sealer encrypts the responses of policies with Encrypt set; such a
	// policy fails closed without one.
	Sealer idem.Sealer
	// Now is the clock that ends key grace periods (key.warn_until);
	// time.Now when nil.
	Now func() time.Time
	// MaxBufferedBytes bounds the body bytes all streams buffer together
	// (see bodyBudget); no bound when zero.
	MaxBufferedBytes int64
	// OnSmallBody, when set, is called each time a stream's body comes to
	// count as small (bodyBudget), so that the collector's pacing can
	// tighten at once: paced only after its next collection, such a body
	// would first fill the headroom the collector left the heap at the
	// last one. Without a budget it is never called.
	OnSmallBody func()
}

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	cfg Config
	// tracer makes spans; nil when tracing is off, so that no span work
	// (each span's context is an allocation) is done at all.
	tracer trace.Tracer
	// budget bounds buffered bodies; nil when unbounded.
	budget *bodyBudget
	// missing remembers which (policy, attribute) pairs were logged, so a
	// filter configured without an attribute is one warning per policy,
	// not one per request; the counter counts every request.
	missing sync.Map
	// att is what every attempt shares.
	att attempt.Server
}

// DefaultSettleAtEndTimeout is Config.SettleAtEndTimeout when unset.
const DefaultSettleAtEndTimeout = 5 * time.Second

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = idem.DefaultStoreTimeout
	}
	if cfg.SettleAtEndTimeout <= 0 {
		cfg.SettleAtEndTimeout = DefaultSettleAtEndTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Policies == nil {
		set := policy.DefaultSet()
		cfg.Policies = func() *policy.Set { return set }
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.Observer = cmp.Or[idem.Observer](cfg.Observer, idem.NopObserver{})
	cfg.EnvoyObserver = cmp.Or[EnvoyObserver](cfg.EnvoyObserver, nopEnvoyObserver{})
	s := &Server{cfg: cfg, att: attempt.Server{Store: cfg.Store, Homes: cfg.Homes, SendHome: cfg.SendHome, Sealer: cfg.Sealer, Observer: cfg.Observer, Log: cfg.Logger,
		StoreTimeout: cfg.StoreTimeout, SettleAtEndTimeout: cfg.SettleAtEndTimeout, MaxMessageTimeout: cfg.MaxMessageTimeout}}
	if cfg.MaxBufferedBytes > 0 {
		s.budget = &bodyBudget{limit: cfg.MaxBufferedBytes, smallBody: cfg.OnSmallBody}
	}
	if tp := cfg.TracerProvider; tp != nil {
		s.tracer = tp.Tracer("github.com/idem-extproc/idem-extproc/internal/extproc")
	}
	return s
}

// Wait waits, until ctx ends, for the work the server's attempts left
// running after their answers (attempt.Server.Wait): a shutdown calls it
// before it closes the store.
func (s *Server) Wait(ctx context.Context) error { return s.att.Wait(ctx) }

// EnvoyObserver is told what the server notices of Envoy's side of the
// conversation, in Envoy's words.
type EnvoyObserver interface {
	// MissingAttribute reports a request of a policy that needed an Envoy
	// attribute (response.code_details, a principal, xds.route_name) the
	// filter did not send.
	MissingAttribute(policy, attribute string)
	// ReplayHeadersDropped reports stored headers left out of a replay
	// because Envoy would refuse them (a control character, or past its
	// header count or size limit).
	ReplayHeadersDropped(policy string, n int)
}

type nopEnvoyObserver struct{}

func (nopEnvoyObserver) MissingAttribute(string, string)  {}
func (nopEnvoyObserver) ReplayHeadersDropped(string, int) {}
