package attempt

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Routing is what the proxy says of a request's way between regions
// (Server.SendHome).
type Routing struct {
	// SentTo names the region a server of another region sent the request
	// to (a SendHome verdict there), as the proxy carried it; "" for a
	// request from a client.
	SentTo string
	// CanSend reports whether the proxy can send this request on to
	// another region: a proxy that routes (Envoy) can, a client's own
	// filter (grpc-go) cannot.
	CanSend bool
}

// route decides, once the record's scope is known, whether the request
// runs here or at its scope's home: it returns the home to send it to, ""
// to decide here, or an error for a request another region's server sent
// here that this server's map homes elsewhere. A request is sent at most
// once: one that was sent here is never sent on, whatever this server's
// map says, so two maps that disagree cannot make a loop; they refuse it
// (ErrHomesDisagree) rather than run it in a store the sender's map does
// not name. A shadow policy never moves a request.
func (a *Attempt) route(scope string) (string, error) {
	if a.Policy.Enforcement != policy.EnforcementEnforce || len(a.srv.SendHome) == 0 && a.Routing.SentTo == "" {
		return "", nil // nothing to send, nor a sender's mark to check: no lookup
	}
	home, here := a.srv.Homes.HomeOf(a.Policy, scope)
	switch sent := a.Routing.SentTo; {
	case sent != "" && (!here || sent != home):
		return "", fmt.Errorf("%w: a server of another region sent the request to region %q, and this server's map homes scope %q in %q",
			ErrHomesDisagree, sent, scope, home)
	case sent != "" || here || !slices.Contains(a.srv.SendHome, home) || !a.Routing.CanSend:
		return "", nil
	}
	return home, nil
}

// routed is named's verdict once the record is named (admit): Continue
// to decide here, SendHome, or the refusal of a request sent here astray
// (503 idempotency-homes-disagree, nothing reserved anywhere).
func (a *Attempt) routed(ctx context.Context) Verdict {
	switch {
	case a.astray != nil:
		return a.unavailable(ctx, a.astray)
	case a.sendTo == "":
		return verdictContinue
	}
	a.conv.Decided(a.Policy.Name, idem.DecisionSentHome)
	a.LogAt(ctx, slog.LevelInfo, "decision", slog.String("decision", string(idem.DecisionSentHome)), slog.String("home", a.sendTo))
	return Verdict{Kind: SendHome, Home: a.sendTo}
}
