package idemclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// maxProblemBody bounds how much of a problem answer is read to learn its
// type; idem-extproc's own are a few hundred bytes.
const maxProblemBody = 64 << 10

// verdict is what one attempt's outcome means for the chain.
type verdict struct {
	retry      bool          // another attempt is safe under the contract
	retryAfter time.Duration // the answer's Retry-After (a floor for the wait)
	why        string        // the reason for retry or stop, for logs
	gaveUp     string        // set when a retryable outcome was not retried
	problem    *ProblemError // set when a problem answer stops the chain
	status     int
	replayed   bool
	probType   string
}

// judge classifies attempt a's outcome (resp or err) under
// the contract. It reads a problem answer's body and puts it back, so a
// response returned to the caller is whole.
func (t *Transport) judge(ctx context.Context, a *attempt, resp *http.Response, err error, resendable bool) verdict {
	keyed := a.key != "" && resendable
	if err != nil {
		a.err = err
		switch {
		case ctx.Err() != nil:
			return verdict{why: "request context ended"}
		case keyed:
			return verdict{retry: true, why: "transport error or timeout; the key makes a retry safe"}
		case resendable && a.refusedBeforeWrite(err):
			return verdict{retry: true, why: "connection refused at dial time, nothing was sent"}
		case a.key != "":
			return verdict{why: "transport error; the body cannot be sent again (no GetBody)"}
		default:
			return verdict{why: "transport error; without a key the request may have taken effect, not retried"}
		}
	}
	v := verdict{status: resp.StatusCode, replayed: Replayed(resp)}
	if v.replayed {
		// The stored answer of an earlier attempt: final, whatever its status.
		v.why = "replayed answer"
		return v
	}
	ra := retryAfter(resp.Header, t.now())
	if isProblem(resp.Header) {
		p := readProblem(resp)
		p.Key, p.Attempt, p.RequestID, p.RetryAfter = a.key, a.n, a.requestID, ra
		v.probType = p.Type
		if p.Type == aboutBlank {
			// RFC 9457 §4.2.1: about:blank adds nothing to the status
			// code, so the answer is judged by its status alone.
			return t.judgeStatus(v, resp, ra, keyed)
		}
		switch p.Slug() {
		// The problems docs/problems.md answers with "retry with the same
		// key": nothing was executed, or another attempt holds the record.
		case problem.InProgress.Slug, problem.StoreUnavailable.Slug, problem.CapacityExceeded.Slug:
			v.retry, v.retryAfter, v.why = keyed, ra, p.Slug()
			if !keyed {
				v.why += "; not retried without a key and a resendable body"
			}
			return v
		}
		v.problem, v.why = p, "problem "+p.Type
		return v
	}
	return t.judgeStatus(v, resp, ra, keyed)
}

// judgeStatus judges an answer that is not one of the contract's problems
// by its status: a 503 may be retried with a key, anything else is the
// answer.
func (t *Transport) judgeStatus(v verdict, resp *http.Response, ra time.Duration, keyed bool) verdict {
	if resp.StatusCode == http.StatusServiceUnavailable {
		v.retry, v.retryAfter, v.why = keyed, ra, "503"
		if !keyed {
			v.why += "; not retried without a key and a resendable body"
		}
		return v
	}
	v.why = "answered"
	return v
}

// isProblem reports an application/problem+json answer (RFC 9457).
func isProblem(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && strings.EqualFold(mt, problem.ContentType)
}

// readProblem reads a problem answer's body (up to maxProblemBody) and
// puts what it read back in front of the rest, so resp can still be
// returned whole. An unreadable or malformed body has type "", an unknown
// problem.
func readProblem(resp *http.Response) *ProblemError {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblemBody))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
	p := &ProblemError{Status: resp.StatusCode, Header: resp.Header.Clone(), Body: body}
	var doc struct {
		Type   *string `json:"type"`
		Title  string  `json:"title"`
		Detail string  `json:"detail"`
	}
	if json.Unmarshal(body, &doc) != nil {
		return p // Type "": unknown
	}
	p.Title, p.Detail = doc.Title, doc.Detail
	p.Type = aboutBlank // RFC 9457 §3.1.1: the default when type is absent
	if doc.Type != nil && *doc.Type != "" {
		p.Type = *doc.Type
	}
	return p
}

// aboutBlank is RFC 9457's problem type that means "nothing beyond the
// status code" (§4.2.1).
const aboutBlank = "about:blank"

// maxRetryAfterParsed bounds a parsed Retry-After, so that arithmetic on
// it cannot overflow; any value this large is over MaxRetryAfter anyway.
const maxRetryAfterParsed = 24 * time.Hour

// retryAfter parses Retry-After (RFC 9110 §10.2.3): delay-seconds or an
// HTTP-date; 0 when absent, malformed or in the past, at most a day.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if s <= 0 {
			return 0
		}
		return min(time.Duration(min(s, int64(maxRetryAfterParsed/time.Second)))*time.Second, maxRetryAfterParsed)
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return min(at.Sub(now), maxRetryAfterParsed)
	}
	return 0
}

// refusedBeforeWrite reports whether err is a connection refused while
// dialling, with no connection obtained and no header written: the only
// failure after which a request without a key is known not to have been
// sent. net/http reports a failed dial as the dialer's *net.OpError with
// Op "dial" (net.Dialer.DialContext; net/http Transport.dialConn wraps the
// dial error only when dialling through a proxy, Op "proxyconnect"), and
// calls the trace's GotConn only once a connection is ready and
// WroteHeaders once the headers are written (net/http/httptrace).
func (a *attempt) refusedBeforeWrite(err error) bool {
	if a.gotConn.Load() || a.wroteHeaders.Load() {
		return false
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" && errors.Is(op.Err, syscall.ECONNREFUSED)
}
