package idemclient

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// resetServer reads each request whole, counts it, then resets the
// connection without answering: the response is lost after the write.
func resetServer(t *testing.T, count *atomic.Int32, answerFrom int32) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if count.Add(1) >= answerFrom {
			w.WriteHeader(http.StatusCreated)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, not FIN
		}
		_ = conn.Close()
	}))
	t.Cleanup(srv.Close)
	return srv
}

// freshConns is a base transport that dials a new connection per attempt,
// so net/http's own retry of a failed reused connection does not mix in.
func freshConns(t *testing.T) *http.Transport {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// TestKeylessNotRetriedAfterReset: the negative path. A POST without a key
// whose connection is reset after it was written may have taken effect: it
// is sent once and the error returned. With a key, the same reset is
// retried.
func TestKeylessNotRetriedAfterReset(t *testing.T) {
	var n atomic.Int32
	srv := resetServer(t, &n, 2)
	tr, _ := newTestTransport(Options{Base: freshConns(t)})
	_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "", "b"))
	var e *Error
	if !errors.As(err, &e) || e.Attempts != 1 || n.Load() != 1 {
		t.Fatalf("keyless: err %v after %d requests, want one request and an *Error", err, n.Load())
	}

	n.Store(0)
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 201 || Attempts(resp) != 2 || n.Load() != 2 {
		t.Fatalf("keyed: status %d, attempts %d, requests %d", resp.StatusCode, Attempts(resp), n.Load())
	}
}

// TestKeylessRetriedOnlyWhenRefusedAtDial: a connection refused while
// dialling means nothing was sent, so even a keyless POST goes again. The
// refusal is real: the first dial goes to a port nothing listens on.
func TestKeylessRetriedOnlyWhenRefusedAtDial(t *testing.T) {
	s := newScript(t, status(201))
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := closed.Addr().String()
	_ = closed.Close()
	var dials atomic.Int32
	base := freshConns(t)
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			addr = dead
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	tr, _ := newTestTransport(Options{Base: base})
	resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "", "b"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 201 || Attempts(resp) != 2 || len(s.Seen()) != 1 {
		t.Fatalf("status %d, attempts %d, arrived %d", resp.StatusCode, Attempts(resp), len(s.Seen()))
	}
}

// TestRefusedBeforeWriteIsPrecise: other dial errors, and a refusal after a
// connection was obtained or headers written, are not "nothing was sent".
func TestRefusedBeforeWriteIsPrecise(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "x"}}
	a := &attempt{}
	if a.refusedBeforeWrite(refused) {
		t.Fatal("a DNS failure is not a refused connection")
	}
	_, err := (&net.Dialer{}).Dial("tcp", deadAddr(t))
	if err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	if !a.refusedBeforeWrite(err) {
		t.Fatalf("a real refused dial (%v) must count", err)
	}
	a.gotConn.Store(true)
	if a.refusedBeforeWrite(err) {
		t.Fatal("after GotConn nothing is known about what was sent")
	}
	b := &attempt{}
	b.wroteHeaders.Store(true)
	if b.refusedBeforeWrite(err) {
		t.Fatal("after WroteHeaders the request may have been sent")
	}
	if (&attempt{}).refusedBeforeWrite(&net.OpError{Op: "read", Err: err}) {
		t.Fatal("a read error is not a dial error")
	}
}

func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestAttemptTimeout: an attempt that gets no answer within AttemptTimeout
// is retried with the same key; a keyless one is not. The server holds the
// first request until the test ends, so the timeout is certain to fire
// first whatever the machine's speed.
func TestAttemptTimeout(t *testing.T) {
	release := make(chan struct{})
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if n.Add(1) == 1 {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	tr, _ := newTestTransport(Options{AttemptTimeout: 50 * time.Millisecond, Base: freshConns(t)})
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 201 || Attempts(resp) != 2 {
		t.Fatalf("status %d after %d attempts", resp.StatusCode, Attempts(resp))
	}

	n.Store(0)
	_, err = tr.RoundTrip(post(t, context.Background(), srv.URL, "", "b"))
	if !errors.Is(err, context.DeadlineExceeded) || n.Load() != 1 {
		t.Fatalf("keyless: err %v after %d requests", err, n.Load())
	}
}

// TestBodyReadableAfterReturn: a response returned by the transport keeps
// its attempt's context alive until the body is closed, even with an
// AttemptTimeout, and a problem answer returned after the last attempt is
// whole.
func TestBodyReadableAfterReturn(t *testing.T) {
	s := newScript(t, status(201))
	tr, _ := newTestTransport(Options{AttemptTimeout: time.Hour})
	resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); body != `{"status":201}` {
		t.Fatalf("body %q", body)
	}
}
