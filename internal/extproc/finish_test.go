package extproc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// TestServerEndsAFinishedStream: once the server needs nothing more of a
// request, it ends the stream with OK right after its reply (stream.go, processor.finished),
// without waiting for the client to close it; until then every message
// gets its reply. Each case sends its messages one by one, reading each
// reply, and never half-closes: the last Recv returns io.EOF only when the
// server itself ended the stream. Before the server ended finished streams every case failed at
// that last Recv (it waited out the context). Where the stream stays open
// is TestFinishedOnlyWhereEnvoyKeepsTheBody.
func TestServerEndsAFinishedStream(t *testing.T) {
	c := client(t)
	type seq = []*extprocv3.ProcessingRequest
	buffered := procmodev3.ProcessingMode_BUFFERED
	cases := []struct {
		name string
		msgs func(key string) seq
		// replay: the key is completed first (by the first write's
		// messages), so that this request is its replay.
		replay bool
	}{
		{"unprotected, BUFFERED: after the request headers", func(string) seq {
			return seq{withModes(reqH(false, ""), buffered, buffered)}
		}, false},
		{"first write, BUFFERED: after the response body", firstWrite, false},
		{"replay, BUFFERED: after the immediate response", func(k string) seq {
			return seq{withModes(reqH(false, k), buffered, buffered), reqB(true)}
		}, true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("finish-%d", i)
			if tc.replay {
				exchange(t, c, firstWrite(key))
			}
			exchange(t, c, tc.msgs(key))
		})
	}
}

// firstWrite is a protected first write's messages in BUFFERED mode.
func firstWrite(key string) []*extprocv3.ProcessingRequest {
	buffered := procmodev3.ProcessingMode_BUFFERED
	return []*extprocv3.ProcessingRequest{withModes(reqH(false, key), buffered, buffered), reqB(true), respH(false), respB(true)}
}

// exchange sends msgs one by one, each answered, never half-closing; the
// server must then end the stream with OK on its own.
func exchange(t *testing.T, c extprocv3.ExternalProcessorClient, msgs []*extprocv3.ProcessingRequest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		if err := st.Send(m); err != nil {
			_, err = st.Recv()
			t.Fatalf("message %d of %d could not be sent: the stream ended with %v", i+1, len(msgs), err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatalf("message %d of %d: no reply, the stream ended with %v", i+1, len(msgs), err)
		}
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last reply the stream ended with %v, want the server's OK close (io.EOF)", err)
	}
}
