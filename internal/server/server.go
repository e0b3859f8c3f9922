// Package server wires the ext_proc server the way production runs it:
// store → metrics wrapper → extproc server → gRPC server with its options.
// The daemon, the end-to-end harness, the proxyless harness and the load
// tool all build their servers here, so that what the tests and the load
// comparison measure is the production wiring.
package server

import (
	"cmp"
	"runtime"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/extprocwire"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
)

// Config is what New wires.
type Config struct {
	// Config configures the ext_proc server. With Metrics set, New
	// replaces its Store by the instrumented store and its Observer and
	// EnvoyObserver by Metrics.
	extproc.Config
	// Metrics, when set, counts every store call and every decision (and
	// with a TracerProvider, traces the store calls); none when nil.
	Metrics *observe.Metrics
	// MaxMessageSize bounds one ext_proc message (DefaultMaxMessageSize
	// when zero).
	MaxMessageSize int
	// Creds are the listener's TLS credentials; plaintext when nil.
	Creds credentials.TransportCredentials
	// Keepalive finds peers gone without a FIN or a reset
	// (DefaultKeepalive where a field is zero).
	Keepalive Keepalive
}

// Keepalive is the ext_proc listener's HTTP/2 keepalive. A peer that
// vanishes without closing its connection (a crashed host, a partition)
// would otherwise hold its streams open, and their leases renewed, until
// the kernel's TCP timeout: grpc-go's server pings only after 2 hours
// without reads by default (google.golang.org/grpc v1.85.0
// internal/transport/defaults.go, defaultServerKeepaliveTime).
type Keepalive struct {
	// Time without a frame read after which the server pings the peer,
	// and Timeout how long it then waits for any frame: past both, the
	// connection is closed and its streams' contexts cancelled
	// (internal/transport/http2_server.go, http2Server.keepalive). grpc-go
	// raises a Time under 1 s to 1 s (server.go, KeepaliveParams). It also
	// sets TCP_USER_TIMEOUT to Timeout, so data the peer never acknowledges
	// closes the connection as soon.
	Time, Timeout time.Duration
	// MinTime is the shortest interval between the peer's pings that the
	// server accepts, with or without streams open. grpc-go counts a
	// strike for each ping sooner than that, and past two strikes without
	// data sent in between answers GOAWAY "too_many_pings" and closes the
	// connection (http2_server.go, handlePing, maxPingStrikes); without
	// streams, any ping sooner than 2 hours strikes unless
	// PermitWithoutStream is set. Envoy pings every
	// connection_keepalive.interval plus up to interval_jitter (15 % by
	// default) of it, streams or not, and the next interval starts at the
	// ping's ACK (envoyproxy/envoy source/common/http/http2/codec_impl.cc,
	// ConnectionImpl::onKeepaliveResponse), so MinTime must not exceed
	// that interval.
	MinTime time.Duration
}

// DefaultKeepalive pings a peer silent for 30 s and gives it 10 s to
// answer, and accepts Envoy's pings down to every 10 s: the shipped
// Envoy configurations ping every 30 s.
var DefaultKeepalive = Keepalive{Time: 30 * time.Second, Timeout: 10 * time.Second, MinTime: 10 * time.Second}

// options are the gRPC server options of k, DefaultKeepalive's value for
// each field left zero.
func (k Keepalive) options() []grpc.ServerOption {
	d := DefaultKeepalive
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cmp.Or(k.Time, d.Time), Timeout: cmp.Or(k.Timeout, d.Timeout)}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cmp.Or(k.MinTime, d.MinTime), PermitWithoutStream: true}),
	}
}

// DefaultMaxMessageSize is the --max-message-size default: above Envoy's
// buffer limits, since a BUFFERED body arrives as one message.
const DefaultMaxMessageSize = 32 << 20

// New builds the gRPC server with ext_proc registered, not yet serving (the
// caller may register more services, such as health, then Serve). It also
// returns the store the ext_proc server calls (cfg.Store, instrumented
// when cfg.Metrics is set) and the ext_proc server, whose Wait a shutdown
// calls before it closes that store.
func New(cfg Config) (*grpc.Server, idem.Store, *extproc.Server) {
	if cfg.Metrics != nil {
		cfg.Store = observe.InstrumentStore(cfg.Store, cfg.Metrics, cfg.TracerProvider)
		cfg.Observer = cfg.Metrics
		cfg.EnvoyObserver = cfg.Metrics
	}
	gs := NewGRPCServer(cfg.MaxMessageSize, cfg.Creds, append(cfg.Keepalive.options(), extprocwire.ServerOption())...)
	ext := extproc.New(cfg.Config)
	extprocv3.RegisterExternalProcessorServer(gs, ext)
	return gs, cfg.Store, ext
}

// NewGRPCServer is the gRPC server ext_proc is served on, with nothing
// registered: the largest message accepted (DefaultMaxMessageSize when
// maxMessageSize is zero), stream workers and, when creds is set, TLS. The
// load tool's no-op and floor servers run on it too, so that they differ
// from idem-extproc only in what they do per message and in the extra
// options New adds (keepalive, and the hand-written ext_proc codec,
// extprocwire): the
// floor stays a minimal server on grpc-go's standard codec. (Its lean
// server takes New's codec as well; its minimal server runs the floor's
// handler on grpc-go's defaults instead.)
//
// Each ext_proc stream is one HTTP request whose handler runs deep
// (decision, store, Redis client); started on a fresh goroutine it grows
// its stack two or three times, copying it each time, which profiles showed
// to be a tenth of the server's CPU. Long-lived workers keep their grown
// stacks, so a stream they take costs no growth; a stream that finds every
// worker busy gets a goroutine of its own, as without workers. A stream
// holds its worker for the whole HTTP request, upstream time included, so
// the workers are many: streamWorkersPerCPU per GOMAXPROCS.
//
// Not too many, though. An idle worker's stack is shrunk by every garbage
// collection (runtime/stack.go shrinkstack: a goroutine using under a
// quarter of its stack gets half of it), and grpc-go hands a stream to the
// worker that has waited longest (server.go serveStreams sends on
// serverWorkerChannel; a channel's receivers are served in the order they
// came), so streams rotate through every idle worker and each worker pays
// the growth again after each collection. Fewer workers than that, each
// busy more often, grow less: at 32 streams, 32 per CPU took 0.92-0.96x
// the server CPU per request of 128 per CPU, and 8 per CPU (fewer workers
// than streams) gave that back (docs/performance.md, "History of
// changes").
func NewGRPCServer(maxMessageSize int, creds credentials.TransportCredentials, extra ...grpc.ServerOption) *grpc.Server {
	if maxMessageSize == 0 {
		maxMessageSize = DefaultMaxMessageSize
	}
	workers := uint32(streamWorkersPerCPU * runtime.GOMAXPROCS(0))
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(maxMessageSize), grpc.NumStreamWorkers(workers)}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	return grpc.NewServer(append(opts, extra...)...)
}

// streamWorkersPerCPU sizes the stream workers (NewGRPCServer).
const streamWorkersPerCPU = 32
