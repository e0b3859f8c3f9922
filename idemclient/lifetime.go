package idemclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// An attempt's lifetime: the race between its response headers and
// AttemptTimeout, the release of its context once its body is read or
// closed, and the responses the caller does not get.

// drop discards a response the caller will not get and releases its
// attempt's context (cancel). Its body is no one's: it is drained only so
// that the connection can be reused, and for at most AttemptTimeout, after
// which cancel cuts it (and its connection). Without that bound a server
// that stalls such a body would hold the whole chain, the headers' timer
// being stopped.
func (t *Transport) drop(resp *http.Response, cancel context.CancelFunc) {
	if resp != nil && t.attemptTO > 0 {
		stop := t.afterFunc(t.attemptTO, cancel)
		defer stop()
	}
	discard(resp)
	cancel()
}

// discard drains a little of a response that is not returned, so its
// connection can be reused, and closes it.
func discard(resp *http.Response) {
	if resp == nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

func closeBody(r *http.Request) {
	if r.Body != nil {
		_ = r.Body.Close()
	}
}

// cancelOnClose releases an attempt's context once the caller has read
// the body it returned to its end or closed it (cancelling earlier would
// cut the body short).
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
	done   atomic.Bool
}

// Read releases the context at io.EOF. That is safe for the connection:
// net/http's body returns io.EOF only after its read loop has taken the
// end of the body and put the connection back to the idle pool
// (transport.go, bodyEOFSignal's fn waits for eofc), so it no longer
// watches the request's context.
func (c *cancelOnClose) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if err == io.EOF {
		c.release()
	}
	return n, err
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.release()
	return err
}

func (c *cancelOnClose) release() {
	if c.done.CompareAndSwap(false, true) {
		c.cancel()
	}
}

// The states of an attempt's race between its response headers and
// AttemptTimeout.
const (
	headersAwaited int32 = iota
	headersIn
	headersTimedOut
)

// headersArrived ends the race between the attempt's response headers
// (or its error) and AttemptTimeout. When the headers won, the timer is
// stopped, so reading the body is bounded by the request's context alone.
// When the timer won, the attempt's context is cancelled and any body cut:
// the attempt timed out, whatever the base transport returned in the
// meantime.
func (a *attempt) headersArrived(resp *http.Response, err error) (*http.Response, error) {
	if a.stopTimer == nil {
		return resp, err
	}
	if a.headers.CompareAndSwap(headersAwaited, headersIn) {
		a.stopTimer()
		return resp, err
	}
	if resp != nil {
		_ = resp.Body.Close()
	}
	var te *attemptTimeoutError
	if errors.As(err, &te) {
		// net/http reports the context's cause itself (transport.go,
		// context.Cause(req.ctx)).
		return nil, err
	}
	// An HTTP/2 round trip reports ctx.Err() (context.Canceled), and a
	// response that raced the timer reports nothing: say which it was.
	return nil, &attemptTimeoutError{after: a.t.attemptTO, err: err}
}

// attemptTimeoutError is an attempt that got no response headers within
// AttemptTimeout. It matches context.DeadlineExceeded, like the deadline
// of the request's context, and is a net.Error timeout.
type attemptTimeoutError struct {
	after time.Duration
	err   error // what the base transport returned, if anything
}

func (e *attemptTimeoutError) Error() string {
	msg := "idemclient: no response headers within AttemptTimeout (" + e.after.String() + ")"
	if e.err != nil {
		msg += ": " + e.err.Error()
	}
	return msg
}

func (e *attemptTimeoutError) Unwrap() error        { return e.err }
func (e *attemptTimeoutError) Is(target error) bool { return target == context.DeadlineExceeded }
func (e *attemptTimeoutError) Timeout() bool        { return true }
func (e *attemptTimeoutError) Temporary() bool      { return true }
