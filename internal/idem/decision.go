package idem

import "time"

// Decision names what the server did with one attempt, for metrics, logs
// and traces. Its values are the decisions_total label values.
type Decision string

// The decisions. The first group is made at the request, the second at the
// response or the end of the stream.
const (
	DecisionBypassed         Decision = "bypassed"          // not protected: no policy, or no key where optional
	DecisionRejected         Decision = "rejected"          // 400, 401 or 413 before any store call
	DecisionReserved         Decision = "reserved"          // first attempt: forwarded
	DecisionReplayed         Decision = "replayed"          // completed: the stored answer
	DecisionConflict         Decision = "conflict"          // 409 request-in-progress
	DecisionMismatch         Decision = "mismatch"          // 422 idempotency-key-reused
	DecisionUnknown          Decision = "unknown"           // 409 outcome-unknown
	DecisionStoreUnavailable Decision = "store_unavailable" // 503, failing closed
	DecisionRecordUnusable   Decision = "record_unusable"   // 503, whatever the failure mode: a stored record that is damaged, not sealed under a policy that encrypts, or does not open
	DecisionFailOpen         Decision = "fail_open"         // store down, passed unprotected
	DecisionShadowed         Decision = "shadowed"          // a shadow policy decided (ShadowDecision) and let the request on
	DecisionSentHome         Decision = "sent_home"         // sent to its scope's home region, whose server decides (attempt.SendHome)

	DecisionStored        Decision = "stored"         // the response completed the record
	DecisionReleased      Decision = "released"       // the record was deleted for a retry
	DecisionMarkedUnknown Decision = "marked_unknown" // the outcome is unknown
)

// DecisionFor names the decision a reservation's outcome leads to.
func DecisionFor(o Outcome) Decision {
	switch o {
	case Reserved:
		return DecisionReserved
	case Completed:
		return DecisionReplayed
	case InFlight:
		return DecisionConflict
	case Unknown:
		return DecisionUnknown
	}
	return DecisionMismatch
}

// ShadowDecision is what an enforcing policy would have done with a request
// that a shadow policy let through.
type ShadowDecision string

// The shadow decisions.
const (
	ShadowWouldReserve  ShadowDecision = "would_reserve"  // first attempt
	ShadowWouldReplay   ShadowDecision = "would_replay"   // a completed record's answer
	ShadowWouldConflict ShadowDecision = "would_conflict" // 409 request-in-progress
	ShadowWouldMismatch ShadowDecision = "would_mismatch" // 422 idempotency-key-reused
	ShadowWouldUnknown  ShadowDecision = "would_unknown"  // 409 outcome-unknown
	ShadowWouldReject   ShadowDecision = "would_reject"   // 400, 401 or 413 (key missing or invalid, no principal, body too large)
	ShadowStoreError    ShadowDecision = "store_error"    // the store could not be asked: nothing measured
)

// Observer is told what the server decides. Package observe implements it
// with Prometheus metrics.
type Observer interface {
	StreamStarted()
	StreamEnded()
	// Decided reports a decision under a policy ("" when none matched).
	Decided(policy string, d Decision)
	// Replayed reports the age of the record a replay came from.
	Replayed(policy string, age time.Duration)
	// SettleFailed reports a final transition the store refused even after
	// the retry at the stream's end: the record turns unknown when its
	// lease ends.
	SettleFailed(policy, op string)
	// Requested reports a request a policy matched, whatever its
	// enforcement, and whether it carried a key: key adoption.
	Requested(policy string, withKey bool)
	// ShadowDecided reports what a shadow policy would have done.
	ShadowDecided(policy string, d ShadowDecision)
	// KeyWarned reports a request without a required key let through
	// during the policy's grace period (key.warn_until).
	KeyWarned(policy string)
	// ReservationCancelled reports how the cancel of a reservation its
	// attempt gave up on ended (Store.Cancel).
	ReservationCancelled(policy string, o CancelOutcome)
}

// CancelOutcome is how the cancel of a reservation its attempt gave up on
// ended: the store's answer, or why there was none. Its values are the
// reservation_cancels_total label values.
type CancelOutcome string

// The cancel outcomes.
const (
	// CancelOutcomeReleased: the reservation had reached the store; it is
	// deleted.
	CancelOutcomeReleased CancelOutcome = "released"
	// CancelOutcomeNotHeld: it had not (or found the key held or settled
	// by another attempt); should it still arrive, it is refused.
	CancelOutcomeNotHeld CancelOutcome = "not_held"
	// CancelOutcomeFailed: the store could not be asked within the
	// cancel's time. A reservation that reached it stays: the key answers
	// request-in-progress, then outcome-unknown.
	CancelOutcomeFailed CancelOutcome = "failed"
	// CancelOutcomeDropped: too many cancels were running to start one;
	// the same holds as for failed.
	CancelOutcomeDropped CancelOutcome = "dropped"
)

// CancelOutcomeOf names the store's answer to a cancel.
func CancelOutcomeOf(r CancelResult) CancelOutcome {
	if r == CancelReleased {
		return CancelOutcomeReleased
	}
	return CancelOutcomeNotHeld
}

// NopObserver observes nothing.
type NopObserver struct{}

func (NopObserver) StreamStarted()                             {}
func (NopObserver) StreamEnded()                               {}
func (NopObserver) Decided(string, Decision)                   {}
func (NopObserver) Replayed(string, time.Duration)             {}
func (NopObserver) SettleFailed(policy, op string)             {}
func (NopObserver) Requested(string, bool)                     {}
func (NopObserver) ShadowDecided(string, ShadowDecision)       {}
func (NopObserver) KeyWarned(string)                           {}
func (NopObserver) ReservationCancelled(string, CancelOutcome) {}

// Sealer encrypts stored responses at rest (package seal implements it):
// the server seals what a policy with encrypt stores and opens what it
// replays; the admin API seals a response an operator supplies.
type Sealer interface {
	Seal(id RecordID, r Response) (Response, error)
	Open(id RecordID, r Response) (Response, error)
}

// Compressor compresses a response's headers and body before it is
// sealed and stored, and expands a stored one back to the bytes the
// upstream sent (package compress implements it). Compress returns the
// response as it is where compressing does not pay; Expand returns an
// uncompressed response as it is, and refuses one that would expand past
// maxBody.
type Compressor interface {
	Compress(r Response) Response
	Expand(r Response, maxBody int) (Response, error)
}

// ShadowDecisionFor names what enforcement would have done with a
// reservation's outcome.
func ShadowDecisionFor(o Outcome) ShadowDecision {
	switch o {
	case Reserved:
		return ShadowWouldReserve
	case Completed:
		return ShadowWouldReplay
	case InFlight:
		return ShadowWouldConflict
	case Unknown:
		return ShadowWouldUnknown
	}
	return ShadowWouldMismatch
}
