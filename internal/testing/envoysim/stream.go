package envoysim

import (
	"context"
	"errors"
	"io"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// errMessageTimeout is Envoy's per-message timeout.
var errMessageTimeout = errors.New("ext_proc per-message timeout exceeded")

// errServerClosed is the server ending the stream with OK before replying.
var errServerClosed = errors.New("ext_proc server closed the stream")

// sideStream is the gRPC stream of one request, opened on first use.
type sideStream struct {
	client  extprocv3.ExternalProcessorClient
	ctx     context.Context
	cancel  context.CancelFunc
	stream  extprocv3.ExternalProcessor_ProcessClient
	replies chan recvResult
	opened  bool
	closed  bool
}

type recvResult struct {
	resp *extprocv3.ProcessingResponse
	err  error
}

func (s *sideStream) open(parent context.Context) error {
	s.opened = true
	// The side stream does not end with the downstream request's context:
	// Envoy resets it explicitly (close), which this cancel does.
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(parent))
	st, err := s.client.Process(s.ctx)
	if err != nil {
		s.cancel()
		s.closed = true
		return err
	}
	s.stream = st
	s.replies = make(chan recvResult, 64)
	go func() {
		for {
			resp, err := st.Recv()
			s.replies <- recvResult{resp, err}
			if err != nil {
				return
			}
		}
	}()
	return nil
}

func (s *sideStream) send(req *extprocv3.ProcessingRequest) error {
	if err := s.stream.Send(req); err != nil {
		if errors.Is(err, io.EOF) {
			// The real status comes from Recv.
			r := <-s.replies
			for r.err == nil {
				r = <-s.replies
			}
			return recvErr(r.err)
		}
		return err
	}
	return nil
}

// recv waits for the next reply until deadline.
func (s *sideStream) recv(ctx context.Context, deadline time.Time) (*extprocv3.ProcessingResponse, error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case r := <-s.replies:
		if r.err != nil {
			return nil, recvErr(r.err)
		}
		return r.resp, nil
	case <-t.C:
		return nil, errMessageTimeout
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// recvErr turns the end of the server's side into errServerClosed; other
// errors are the gRPC status the server (or transport) gave.
func recvErr(err error) error {
	if errors.Is(err, io.EOF) {
		return errServerClosed
	}
	return err
}

// close half-closes the stream and resets it right away, as
// ProcessorStreamImpl::close does.
func (s *sideStream) close() {
	if !s.opened || s.closed {
		return
	}
	s.closed = true
	_ = s.stream.CloseSend()
	s.cancel()
}
