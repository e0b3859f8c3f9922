// Package attempt owns one attempt's life under a policy, in the domain's
// terms and without any protocol in it: admit (the policy, key and scope
// that name the record), decide (reserve it, wait for the attempt that
// holds it, open what it stored), respond (the response rules that say
// what a response proves) and settle (complete, release or mark unknown,
// renew the lease meanwhile, retry a refused transition at the end).
//
// Each decision point returns a Verdict (verdict.go): what the request is
// to do, with the policy's enforcement, shadow mode, key grace period,
// failure mode and the outcome's answer already applied (docs/design.md §3
// and §9), so that the protocol side only renders it for the phase at hand
// and the caller (HTTP, gRPC, JSON-RPC).
//
// One word names an attempt's last transition, whichever it is: settle
// (AtResponse, SettleAtEnd). Complete, Release and MarkUnknown are the
// store's transitions it applies.
//
// Package extproc holds the conversation with Envoy around it: which
// message carries what, body modes, replies. One Attempt lives inside one
// ext_proc stream's processor.
package attempt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Server is what every attempt of one server shares.
type Server struct {
	Store idem.Store
	// Homes, when set, finds the store that arbitrates the keys of a
	// policy with a homes map (policy.Homes): another region's, for a
	// scope homed there. Without it, or for a policy without homes, every
	// key lives in Store.
	Homes HomeFinder
	// SendHome names the regions a request of an enforced policy whose
	// scope is homed there is sent to through the proxy (a SendHome
	// verdict), where its server reserves in its own store, instead of
	// this server making the store calls across regions (route, admit.go): those
	// the proxy has a route for.
	SendHome []string
	// Sealer seals and opens the responses of policies with Encrypt; nil
	// when the server has no key ring.
	Sealer   idem.Sealer
	Observer idem.Observer
	// Log takes every attempt's lines (LogAt) and the lease renewer's
	// warnings.
	Log *slog.Logger
	// StoreTimeout bounds each store call made while Envoy waits.
	StoreTimeout time.Duration
	// MaxMessageTimeout is the longest Envoy extends one message's timer
	// (the filter's max_message_timeout): a longer ask is ignored, not
	// capped (ext_proc.cc Filter::onNewTimeout), so no ask is ever made
	// above it and a wait is shortened to fit. Zero means no limit is known.
	MaxMessageTimeout time.Duration
	// SettleAtEndTimeout bounds the settling done once the stream ended,
	// and the cancel of a reservation given up on (settle.go, giveUp).
	SettleAtEndTimeout time.Duration

	// cancelling counts the cancels running (settle.go, giveUp); background
	// tracks them for Wait.
	cancelling atomic.Int32
	background sync.WaitGroup
}

// Wait waits, until ctx ends, for the work attempts left running after
// their answers: the cancels of reservations given up on (settle.go, giveUp). A
// shutdown waits for them before it closes the store, so that a cancel
// under way is finished, or fails and says so, rather than vanishing with
// the process.
func (s *Server) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.background.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("background work still running: %w", ctx.Err())
	}
}

// HomeFinder finds where the keys of a scope are arbitrated when they live
// in several regions' stores (package region).
type HomeFinder interface {
	// StoreFor returns the store one attempt of p's key in scope calls for
	// its whole life. A home the finder cannot use gives a store whose
	// calls fail.
	StoreFor(p *policy.Policy, scope, key string) HomeStore
	// HomeOf names the region whose store arbitrates the keys of scope
	// under p now, and whether it is this server's own.
	HomeOf(p *policy.Policy, scope string) (home string, here bool)
}

// HomeStore is the store of one attempt's record as a HomeFinder placed
// it. It bounds each call by the budget of the store the call goes to.
//
// Its Reserve may answer idem.Moved: a tombstone newer than the server's
// map sent the key to a store whose calls need more time than the proxy
// gave the message. The attempt then asks the proxy for Budget and
// reserves again, once.
type HomeStore interface {
	idem.Store
	// Budget is the time the attempt's next call may take while the
	// proxy waits, with every store call it makes on the way (a
	// hand-over before a reservation, a tombstone followed).
	Budget() time.Duration
}

// The errors of a HomeStore that refuse a request whatever its policy's
// failure mode: passing it unprotected would not be a store outage
// tolerated but a key left to run in two places.
var (
	// ErrHomeOutOfReach: the calls to the key's home cannot fit in the
	// time the proxy grants one message (MaxMessageTimeout); nothing was
	// reserved.
	ErrHomeOutOfReach = errors.New("the key's home region is out of reach within the proxy's timers")
	// ErrHomesDisagree: the key's stores name different homes for it
	// (two homes maps); nothing was reserved.
	ErrHomesDisagree = errors.New("the homes maps disagree about the key's home")
)

// Conversation is the attempt's side of the protocol's conversation: it
// puts a decision on the request's metrics and span, and gives the context
// for work that outlives the message at hand. (Log lines are the
// attempt's own, LogAt: a variadic call through an interface would cost an
// allocation per line.)
type Conversation interface {
	// Decided reports a decision under a policy ("" when none matched)
	// to the observer and on the span.
	Decided(policy string, d idem.Decision)
	// Background is the context of work that outlives the current
	// message (the lease's renewal): it carries the stream's span; its
	// cancellation is ignored.
	Background() context.Context
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
	token idem.Token
	// Number is the attempt's number for the operation (1 for the first);
	// zero until the store told it.
	Number int
	// RequestID is the request's x-request-id, for the log lines.
	RequestID string
	// Routing is what the proxy says of the request's way between
	// regions (route, admit.go); set before the record is named.
	Routing Routing
	// started is when the attempt's stream began: its lines' latency.
	started time.Time

	// home is where a homes map placed the record (Server.Homes); nil
	// when it lives in Server.Store (recordStore, storeBudget), or when
	// the request goes to another region (SendHome, named).
	home *home
	// method and path are the request's, for its fingerprint; fpHeaders
	// the policy's fingerprint headers, read at the headers (Request).
	method, path string
	fpHeaders    []idem.Header
	// cands are the policies a request deferred to its body may end with
	// (readBody), until Request picks one (pickAtBody).
	cands []candidate
	// callID is the JSON-RPC id of the call a policy with answers: jsonrpc
	// took at its body: a replay is that call's response (answer).
	callID []byte

	// renew keeps the lease alive; it is set exactly while this attempt
	// holds the record and has not settled it (held).
	renew *renewer

	// retry is a final transition the store refused; SettleAtEnd tries it
	// once more.
	retry         func(context.Context) error
	retryDecision decisionCode
	// keySource is where the key came from (admitKeyFrom); a derived
	// key's record lives in the policy's derived key space.
	keySource policy.KeySource
	// origin is the origin of the response actionFor judged, retried
	// whether an earlier upstream attempt may have been sent.
	origin  idem.Origin
	retried bool
	// atBody: the policy and key were decided at the request's body
	// (admitKeyFrom); the decision's line says where the key came from.
	atBody bool
	// storing: the response was judged to be stored (AtResponse); its
	// end completes the record.
	storing bool
	// wait is the decision a Wait verdict left for Await.
	wait *waiting
	// asked is what the proxy was asked for before a far home's calls
	// (askForHome); waitFor is the wait a duplicate has within what it
	// grants (extension).
	asked, waitFor time.Duration
}

// New returns an attempt of srv that talks through conv.
func New(srv *Server, conv Conversation) Attempt {
	return Attempt{srv: srv, conv: conv, started: time.Now()}
}

// decisionCode is a settling decision in one byte: an ext_proc stream's
// state then fits the allocation size class it had before the attempt
// moved here (512 bytes instead of 480 per request otherwise).
type decisionCode uint8

const (
	codeStored decisionCode = iota
	codeReleased
	codeMarkedUnknown
)

var settleDecisions = [...]idem.Decision{idem.DecisionStored, idem.DecisionReleased, idem.DecisionMarkedUnknown}

func (c decisionCode) decision() idem.Decision { return settleDecisions[c] }

// maxLogAttrs is room for an attempt's fields and a line's own, gathered
// on the stack before they reach the record.
const maxLogAttrs = 16

// LogAt writes one line about this attempt at level: the fields that
// trace it (the hashed key, that is the record id, never the raw key;
// scope, policy, request id and attempt number; the latency so far), then
// extra. A decision's line is on the hot path, so nothing is built when
// the level is off, and the record goes to the handler directly:
// Logger.LogAttrs would also walk the stack for a source position the
// handler never prints. The attributes are added in one call: a record
// holds five inline and grows its overflow slice at each call past them,
// so adding them piecemeal allocated twice per line. It takes no context:
// the server's handlers (internal/asynclog over slog's JSON and text
// handlers) read nothing from one, and these fields are what tie a line
// to its operation and attempt.
func (a *Attempt) LogAt(level slog.Level, msg string, extra ...slog.Attr) {
	h := a.srv.Log.Handler()
	ctx := context.Background()
	if !h.Enabled(ctx, level) {
		return
	}
	var buf [maxLogAttrs]slog.Attr
	attrs := buf[:0]
	if a.Policy != nil {
		attrs = append(attrs, slog.String("policy", a.Policy.Name))
	}
	if a.ID != "" {
		attrs = append(attrs, slog.String("key_hash", string(a.ID)), slog.String("scope", a.Scope))
	}
	if a.RequestID != "" {
		attrs = append(attrs, slog.String("request_id", a.RequestID))
	}
	if a.Number > 0 {
		attrs = append(attrs, slog.Int("attempt", a.Number))
	}
	attrs = append(attrs, slog.Float64("latency_ms", float64(time.Since(a.started).Microseconds())/1000))
	r := slog.NewRecord(time.Now(), level, msg, 0)
	r.AddAttrs(append(attrs, extra...)...)
	_ = h.Handle(ctx, r)
}

// renewer is the attempt's hold on its record: it keeps the reservation's
// lease alive while its stream is open, renewing at half the lease so that
// short requests never cost a renewal, and carries the record's store and
// call budget (recordStore, storeBudget) for the settlement that stops it.
type renewer struct {
	store  idem.Store
	budget time.Duration
	log    *slog.Logger
	id     idem.RecordID
	token  idem.Token
	lease  time.Duration
	// base carries the stream's span, without its cancellation.
	base context.Context

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// tick renews the lease once, and sets the next renewal.
func (r *renewer) tick() {
	ctx, cancel := context.WithTimeout(r.base, r.budget)
	err := r.store.Renew(ctx, r.id, r.token, r.lease)
	cancel()
	next := r.lease / 2
	if err != nil {
		r.log.Warn("lease renewal failed", slog.String("key_hash", string(r.id)), slog.String("error", err.Error()))
		if definite(err) {
			return
		}
		// Try again well before the lease runs out.
		next /= 5
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopped {
		r.timer.Reset(next)
	}
}

func (r *renewer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	r.timer.Stop()
}

// home is the store of a record a homes map placed.
type home struct {
	store HomeStore
	// asked is set once the proxy was asked for the home's time
	// (Request): it extends a message's timer once.
	asked bool
}
