package loadtest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/idem-extproc/idem-extproc/internal/extprocwire"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	luascripts "github.com/idem-extproc/idem-extproc/internal/redisstore/scripts"
	idemserver "github.com/idem-extproc/idem-extproc/internal/server"
)

// The reference servers the load tool measures idem-extproc against. Each
// runs in a process of its own (the tool re-executes itself), so that the
// CPU read from /proc is its own; the no-op and the floor run on the
// daemon's gRPC server (idemserver.NewGRPCServer), lean on it with the
// product's codec, minimal on grpc-go's.
//
//   - noop answers every message CONTINUE, in the reply type of the
//     message, and never overrides the processing mode: the cost of the
//     ext_proc protocol itself.
//   - floor sends the same replies idem-extproc sends for the load tool's
//     requests, with exactly the Redis calls idem-extproc makes, as bare
//     EVALSHA calls of the store's own scripts: reserve at the request
//     body (answering a completed record with its status and body at
//     once), complete at the response body, and for a request without a
//     key or a GET, CONTINUE with the skip-everything override at the
//     request headers. No policy, no fingerprint, no header conversion,
//     no encoding, no logging, no metrics: the floor of what any
//     Redis-backed idempotency server must do.
//   - minimal is the floor's handler on grpc-go's default server
//     (grpc.NewServer with only the daemon's message size limit): a new
//     goroutine per stream instead of the daemon's stream workers, the
//     server anyone would write first. The floor shares the daemon's
//     gRPC tuning, so the product's ratio to it counts only what the
//     product does per request; its ratio to minimal also counts that
//     tuning, as a reference server written from scratch would.
//   - lean is the floor's replies on the product's own parts (its store,
//     codec and GC setting) with none of its logic (leanServer): the
//     product's ratio to lean is what its logic costs, and lean's ratio
//     to the floor is the most that trimming that logic could gain.

// daemonGRPC is the daemon's gRPC server, with its default
// --max-message-size; defaultGRPC is grpc-go's, with the same limit.
func daemonGRPC() *grpc.Server {
	return idemserver.NewGRPCServer(idemserver.DefaultMaxMessageSize, nil)
}

// productGRPC is the daemon's gRPC server with the product's codec, as
// server.New builds it.
func productGRPC() *grpc.Server {
	return idemserver.NewGRPCServer(idemserver.DefaultMaxMessageSize, nil, extprocwire.ServerOption())
}

func defaultGRPC() *grpc.Server {
	return grpc.NewServer(grpc.MaxRecvMsgSize(idemserver.DefaultMaxMessageSize))
}

// serveGRPC serves one ext_proc implementation on addr, on the gRPC
// server newServer makes, until ctx ends.
func serveGRPC(ctx context.Context, addr string, srv extprocv3.ExternalProcessorServer, newServer func() *grpc.Server) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	gs := newServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go func() {
		<-ctx.Done()
		gs.Stop()
	}()
	if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// continueReply answers a message with CONTINUE in its own reply type.
func continueReply(req *extprocv3.ProcessingRequest, mode *procmodev3.ProcessingMode) *extprocv3.ProcessingResponse {
	resp := &extprocv3.ProcessingResponse{ModeOverride: mode}
	switch req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		resp.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		resp.Response = &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}
	case *extprocv3.ProcessingRequest_RequestBody:
		resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		resp.Response = &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		resp.Response = &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		resp.Response = &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}
	}
	return resp
}

// noopServer is the no-op reference.
type noopServer struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (noopServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		if err := stream.Send(continueReply(req, nil)); err != nil {
			return err
		}
	}
}

// skipEverything is idem-extproc's override for an unprotected request.
var skipEverything = &procmodev3.ProcessingMode{
	RequestHeaderMode:   procmodev3.ProcessingMode_SKIP,
	ResponseHeaderMode:  procmodev3.ProcessingMode_SKIP,
	RequestBodyMode:     procmodev3.ProcessingMode_NONE,
	ResponseBodyMode:    procmodev3.ProcessingMode_NONE,
	RequestTrailerMode:  procmodev3.ProcessingMode_SKIP,
	ResponseTrailerMode: procmodev3.ProcessingMode_SKIP,
}

// refLease and refRetention are the lease and retention of the floor's
// and lean's records.
const refLease, refRetention = 30 * time.Second, 24 * time.Hour

// floorServer is the floor reference.
type floorServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	rdb                  redis.UniversalClient
	reserveSHA, complSHA string
	fingerprint, token   []byte
	leaseMs, retentionMs int64
	storedHeaders        []byte
}

func newFloorServer(ctx context.Context, redisURL string, storeTimeout time.Duration) (*floorServer, error) {
	// The daemon's client, with the daemon's budget: for a
	// redis+cluster:// URL a go-redis ClusterClient, as the daemon's, so
	// on a cluster the floor makes the same calls the same way. Its
	// ScriptLoad loads the script on every shard (go-redis v9
	// osscluster_commands.go, ClusterClient.ScriptLoad, ForEachShard),
	// and EvalSha goes to the node owning its first key's slot (go-redis
	// command.go, cmdFirstKeyPos; the key is hash-tagged as the
	// product's: floor:{<key>}).
	rdb, err := redisstore.NewClient(redisURL, storeTimeout)
	if err != nil {
		return nil, err
	}
	f := &floorServer{
		rdb: rdb, fingerprint: make([]byte, 32), token: []byte("floor-token-0001"),
		leaseMs: refLease.Milliseconds(), retentionMs: refRetention.Milliseconds(),
		// A fixed stand-in for the stored headers: the floor does no
		// encoding work, but stores about as many bytes.
		storedHeaders: []byte("\x02\x0ccontent-type\x10application/json\x08location\x0f/v1/orders/0123"),
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if f.reserveSHA, err = rdb.ScriptLoad(lctx, luascripts.Source("reserve")).Result(); err != nil {
		return nil, fmt.Errorf("load reserve.lua: %w", err)
	}
	if f.complSHA, err = rdb.ScriptLoad(lctx, luascripts.Source("complete")).Result(); err != nil {
		return nil, fmt.Errorf("load complete.lua: %w", err)
	}
	return f, nil
}

func rawHeader(m *corev3.HeaderMap, name string) []byte {
	for _, h := range m.GetHeaders() {
		if h.GetKey() == name {
			return h.GetRawValue()
		}
	}
	return nil
}

// refCalls are one protected request's two store calls, made by a
// reference server that answers as the floor does (referenceStream).
type refCalls interface {
	// reserve reserves the request's key at its request body; for a
	// completed record it reports the stored status and body to replay.
	reserve(ctx context.Context) (completed bool, status int, body []byte, err error)
	// complete stores the upstream's status and body at the response body.
	complete(ctx context.Context, status int, body []byte) error
}

// referenceStream serves one stream with the floor's replies: the
// skip-everything override at the request headers for a request without
// a key or a GET; for a protected one the store calls open makes (reserve
// at the request body, answering a completed record with its status and
// body at once; complete at the response body) and CONTINUE otherwise.
func referenceStream(stream extprocv3.ExternalProcessor_ProcessServer, open func(key []byte) refCalls) error {
	ctx := stream.Context()
	var calls refCalls
	var status int
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil // the stream's end, however it ends
		}
		var resp *extprocv3.ProcessingResponse
		switch m := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			hs := m.RequestHeaders.GetHeaders()
			k := rawHeader(hs, "idempotency-key")
			if len(k) == 0 || string(rawHeader(hs, ":method")) != "POST" {
				resp = continueReply(req, skipEverything)
				break
			}
			calls = open(k)
			resp = continueReply(req, nil)
		case *extprocv3.ProcessingRequest_RequestBody:
			if calls == nil {
				resp = continueReply(req, nil)
				break
			}
			completed, st, body, err := calls.reserve(ctx)
			if err != nil {
				return err
			}
			if completed {
				resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
					ImmediateResponse: &extprocv3.ImmediateResponse{
						Status: &typev3.HttpStatus{Code: typev3.StatusCode(st)},
						Body:   body,
					}}}
				break
			}
			resp = continueReply(req, nil)
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			status, _ = strconv.Atoi(string(rawHeader(m.ResponseHeaders.GetHeaders(), ":status")))
			resp = continueReply(req, nil)
		case *extprocv3.ProcessingRequest_ResponseBody:
			if calls != nil {
				if err := calls.complete(ctx, status, m.ResponseBody.GetBody()); err != nil {
					return err
				}
			}
			resp = continueReply(req, nil)
		default:
			resp = continueReply(req, nil)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (f *floorServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return referenceStream(stream, func(k []byte) refCalls {
		return &floorCalls{f: f, key: "floor:{" + string(k) + "}"}
	})
}

// cancelMarkerKey is the key of the marker of tok's cancelled
// reservation of the record under recordKey, as redisstore names it
// (store.go, cancelledSep) and reserve.lua reads it as KEYS[2].
func cancelMarkerKey(recordKey string, tok idem.Token) string {
	return recordKey + ":cancelled:" + tok.String()
}

// floorCalls are the floor's bare EVALSHA calls for one request's key.
type floorCalls struct {
	f   *floorServer
	key string
}

func (c *floorCalls) reserve(ctx context.Context) (bool, int, []byte, error) {
	f := c.f
	// KEYS as the product's: the record and the token's cancel marker.
	keys := []string{c.key, cancelMarkerKey(c.key, idem.Token(f.token))}
	v, err := f.rdb.EvalSha(ctx, f.reserveSHA, keys, f.fingerprint, f.token, f.leaseMs, f.retentionMs, "u").Slice()
	if err != nil {
		return false, 0, nil, err
	}
	if s, _ := v[0].(string); s != "completed" || len(v) != 4 {
		return false, 0, nil, nil
	}
	// The record's string: its fixed head, then the status as a uvarint,
	// a flags byte, the floor's own fixed headers, and the body
	// (redisstore's layout).
	rec := asString(v[3])
	if len(rec) < completedHeadLen || rec[0] != completedLayout {
		return false, 0, nil, fmt.Errorf("floor: a completed record of %d bytes that the floor did not write", len(rec))
	}
	st, n := binary.Uvarint([]byte(rec[completedHeadLen:]))
	at := completedHeadLen + n + 1 + len(f.storedHeaders)
	if n <= 0 || at > len(rec) {
		return false, 0, nil, fmt.Errorf("floor: a completed record of %d bytes that the floor did not write", len(rec))
	}
	return true, int(st), []byte(rec[at:]), nil
}

// completedLayout and completedHeadLen are the first byte and the fixed
// head of a completed record in the layout redisstore's complete.lua
// writes (internal/redisstore/codec.go): the floor reads only records its
// own calls to that script wrote, whose length the script checked before
// replying. TestSmoke's floor replays fail if the layout moves without
// them.
const (
	completedLayout  = 'e'
	completedHeadLen = 63
)

func (c *floorCalls) complete(ctx context.Context, status int, body []byte) error {
	f := c.f
	head := append(binary.AppendUvarint(make([]byte, 0, 3+len(f.storedHeaders)), uint64(status)), 0)
	return f.rdb.EvalSha(ctx, f.complSHA, []string{c.key}, f.token, f.retentionMs,
		append(head, f.storedHeaders...), body).Err()
}

func asString(v any) string {
	s, _ := v.(string)
	return s
}

// leanServer is the floor's replies on the product's own Redis path and
// wire codec, with none of its logic: the two calls go through
// redisstore.Store (its batcher, its record encoding, its per-call
// budget), the server answers with extprocwire's codec on the daemon's
// gRPC server, and its process runs at the daemon's default GOGC
// (serveReference). No policy, fingerprint, header conversion, logging or
// metrics. It bounds what trimming the product's own logic could gain:
// the product's ratio to lean is what that logic costs.
type leanServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	st            *redisstore.Store
	storedHeaders []idem.Header
}

func newLeanServer(redisURL string, storeTimeout time.Duration) (*leanServer, error) {
	rdb, err := redisstore.NewClient(redisURL, storeTimeout)
	if err != nil {
		return nil, err
	}
	return &leanServer{
		st: redisstore.New(rdb, redisstore.Options{Prefix: "lean:", CallTimeout: storeTimeout}),
		// The floor's stand-in for the stored headers (floorServer).
		storedHeaders: []idem.Header{{Name: "content-type", Value: "application/json"}, {Name: "location", Value: "/v1/orders/0123"}},
	}, nil
}

func (l *leanServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return referenceStream(stream, func(k []byte) refCalls {
		return &leanCalls{l: l, r: idem.Reservation{ID: idem.RecordID(k), Fingerprint: idem.Fingerprint{1},
			Token: idem.NewToken(), Lease: refLease, Retention: refRetention}}
	})
}

// leanCalls are one request's calls through the product's store.
type leanCalls struct {
	l *leanServer
	r idem.Reservation
}

func (c *leanCalls) reserve(ctx context.Context) (bool, int, []byte, error) {
	res, err := c.l.st.Reserve(ctx, c.r)
	if err != nil || res.Outcome != idem.Completed {
		return false, 0, nil, err
	}
	return true, res.Response.Status, res.Response.Body, nil
}

func (c *leanCalls) complete(ctx context.Context, status int, body []byte) error {
	return c.l.st.Complete(ctx, c.r.ID, c.r.Token, idem.Response{Status: status, Headers: c.l.storedHeaders, Body: body}, c.r.Retention)
}
