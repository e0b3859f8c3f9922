package server

import (
	"context"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// streams reports when an ext_proc stream starts and ends, and its
// decisions.
type streams struct {
	idem.NopObserver
	started, ended chan struct{}
	mu             sync.Mutex
	decisions      []idem.Decision
}

func (s *streams) StreamStarted() { s.started <- struct{}{} }
func (s *streams) StreamEnded()   { s.ended <- struct{}{} }
func (s *streams) Decided(_ string, d idem.Decision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decisions = append(s.decisions, d)
}

// TestSilentPeerIsDropped: a peer whose connection goes silent, without a
// FIN or a reset (a link the test holds in both directions, as a crashed
// host or a partition would), has its stream ended by the server's
// keepalive within Time plus Timeout, and its reservation is settled as
// for a stream reset (unknown), so nothing goes on renewing the lease of a
// request nobody waits for.
func TestSilentPeerIsDropped(t *testing.T) {
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = st.Close() })
	obs := &streams{started: make(chan struct{}, 1), ended: make(chan struct{}, 1)}
	ka := Keepalive{Time: time.Second, Timeout: time.Second} // grpc-go's smallest Time
	gs, _, _ := New(Config{Config: extproc.Config{Store: st, Observer: obs}, Keepalive: ka})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	// A TCP link the test controls: held, it forwards nothing either way
	// and closes nothing, while the kernel keeps both sockets alive.
	link := redistest.NewDelayLink(t, lis.Addr().String())
	conn, err := grpc.NewClient(link.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A protected POST with a key and no body: reserved at its headers.
	var hs []*corev3.HeaderValue
	for _, h := range [][2]string{{":method", "POST"}, {":path", "/orders"}, {":authority", "shop"}, {"idempotency-key", "k1"}} {
		hs = append(hs, &corev3.HeaderValue{Key: h[0], RawValue: []byte(h[1])})
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	<-obs.started
	obs.mu.Lock()
	reserved := slices.Equal(obs.decisions, []idem.Decision{idem.DecisionReserved})
	obs.mu.Unlock()
	if !reserved {
		t.Fatalf("decisions %v, want reserved", obs.decisions)
	}

	link.Hold(true, true)
	held := time.Now()
	// Bounded wait: without keepalive the stream stays for grpc-go's 2 h.
	select {
	case <-obs.ended:
		t.Logf("stream ended %v after the peer went silent (Time %v + Timeout %v)", time.Since(held).Round(10*time.Millisecond), ka.Time, ka.Timeout)
	case <-time.After(30 * time.Second):
		t.Fatalf("the stream of a silent peer still runs %v after it went silent", time.Since(held).Round(time.Second))
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if want := []idem.Decision{idem.DecisionReserved, idem.DecisionMarkedUnknown}; !slices.Equal(obs.decisions, want) {
		t.Fatalf("decisions %v, want %v", obs.decisions, want)
	}
}

// TestPingsAtEnvoysPaceAreAccepted: a peer that pings no sooner than
// MinTime, on a connection without streams as Envoy's
// connection_keepalive does, keeps its connection; one that pings faster
// is sent GOAWAY too_many_pings (grpc-go http2_server.go, handlePing).
func TestPingsAtEnvoysPaceAreAccepted(t *testing.T) {
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = st.Close() })
	ka := Keepalive{MinTime: 200 * time.Millisecond}
	gs, _, _ := New(Config{Config: extproc.Config{Store: st}, Keepalive: ka})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// The client preface and an empty SETTINGS frame (RFC 9113 §3.4), then
	// PING frames (§6.7): a 9-byte frame header and 8 bytes of data.
	if _, err := c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")); err != nil {
		t.Fatal(err)
	}
	goAway := make(chan string, 1)
	go func() { goAway <- readGoAway(c) }()
	ping := func() {
		if _, err := c.Write([]byte("\x00\x00\x08\x06\x00\x00\x00\x00\x00pingpong")); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		ping()
		select {
		case why := <-goAway:
			t.Fatalf("pings %v apart got GOAWAY %q", ka.MinTime+50*time.Millisecond, why)
		case <-time.After(ka.MinTime + 50*time.Millisecond):
		}
	}
	for range 4 {
		ping()
	}
	if why := <-goAway; why != "too_many_pings" {
		t.Fatalf("pings back to back: GOAWAY %q, want too_many_pings", why)
	}
}

// readGoAway reads HTTP/2 frames from c until a GOAWAY (RFC 9113 §6.8) and
// returns its debug data, or the read error's text.
func readGoAway(c net.Conn) string {
	var head [9]byte
	for {
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return err.Error()
		}
		body := make([]byte, int(head[0])<<16|int(head[1])<<8|int(head[2]))
		if _, err := io.ReadFull(c, body); err != nil {
			return err.Error()
		}
		if head[3] == 0x7 && len(body) >= 8 {
			return string(body[8:])
		}
	}
}
