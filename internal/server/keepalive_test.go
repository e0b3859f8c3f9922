package server

import (
	"context"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// streams reports when an ext_proc stream starts and ends.
type streams struct {
	idem.NopObserver
	started, ended chan struct{}
}

func (s *streams) StreamStarted() { s.started <- struct{}{} }
func (s *streams) StreamEnded()   { s.ended <- struct{}{} }

// TestSilentPeerIsDropped: a peer whose connection goes silent, without a
// FIN or a reset (a link the test holds in both directions, as a crashed
// host or a partition would), has its stream ended by the server's
// keepalive within Time plus Timeout, so nothing goes on renewing the
// lease of a request nobody waits for.
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
	if _, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-obs.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream never reached the server")
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
}
