// Package attempt owns one attempt's life under a policy, in the domain's
// terms and without any protocol in it: admit (the policy, key and scope
// that name the record), decide (reserve it, wait for the attempt that
// holds it, open what it stored), respond (the response rules that say
// what a response proves) and settle (complete, release or mark unknown,
// renew the lease meanwhile, retry a refused transition at the end).
//
// Package extproc holds the conversation with Envoy around it: which
// message carries what, body modes, replies. One Attempt lives inside one
// ext_proc stream's processor.
package attempt

import (
	"context"
	"log/slog"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Server is what every attempt of one server shares.
type Server struct {
	Store idem.Store
	// Sealer seals and opens the responses of policies with Encrypt; nil
	// when the server has no key ring.
	Sealer   idem.Sealer
	Observer idem.Observer
	// Log takes the lease renewer's warnings, which run outside any
	// request's call.
	Log *slog.Logger
	// StoreTimeout bounds each store call made while Envoy waits.
	StoreTimeout time.Duration
	// FinishTimeout bounds the settling done once the stream ended.
	FinishTimeout time.Duration
}

// Conversation is the attempt's side of the protocol's conversation: it
// puts what the attempt does on the request's log lines and span, with the
// fields it knows (request id, latency), and tells the proxy about a wait.
type Conversation interface {
	// Decided reports a decision (observer, span).
	Decided(d idem.Decision)
	// LogAt writes one line about the request at level.
	LogAt(ctx context.Context, level slog.Level, msg string, extra ...slog.Attr)
	// BeforeWait runs before a duplicate waits up to d for the attempt in
	// flight (the proxy may need to extend its own timer); an error
	// abandons the wait.
	BeforeWait(d time.Duration) error
}

// Attempt is one attempt of an operation: the record it names and what it
// holds of it. Its zero value, from New, is an attempt not yet admitted.
type Attempt struct {
	srv  *Server
	conv Conversation

	// Policy is the policy the request matched; nil when none did.
	Policy *policy.Policy
	// ID names the record; empty until the key is admitted.
	ID    idem.RecordID
	Scope string
	Token idem.Token
	// Number is the attempt's number for the operation (1 for the first);
	// zero until the store told it.
	Number int

	held  bool // this attempt holds the record and has not settled it
	renew *renewer

	// retry is a final transition the store refused; End tries it once
	// more.
	retry         func(context.Context) error
	retryDecision idem.Decision
}

// New returns an attempt of srv that talks through conv.
func New(srv *Server, conv Conversation) Attempt {
	return Attempt{srv: srv, conv: conv}
}

// Admit names the record of the request's key in its scope under the
// attempt's policy.
func (a *Attempt) Admit(scope, key string) {
	a.Scope = scope
	a.ID = idem.RecordIDFor(a.Policy.RecordNamespace(), scope, key)
}

// Held reports whether this attempt holds the record and has not settled
// it yet.
func (a *Attempt) Held() bool { return a.held }

// PolicyName is the matched policy's name, "" when none matched.
func (a *Attempt) PolicyName() string {
	if a.Policy == nil {
		return ""
	}
	return a.Policy.Name
}

// StoreCtx bounds one store call made while Envoy waits.
func (a *Attempt) StoreCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.srv.StoreTimeout)
}
