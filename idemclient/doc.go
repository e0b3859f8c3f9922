// Package idemclient is the client half of idem-extproc's contract: an
// http.RoundTripper that retries a write only where the contract makes a
// retry safe, and stops where it does not.
//
// One operation is one Idempotency-Key. Every attempt of the operation
// carries the same key (sent in the IETF Structured Field form,
// Idempotency-Key: "…"), its own X-Request-Id and its attempt number
// (AttemptHeader), so each attempt can be found in the client's logs, the
// proxy's access log and the server's logs. The transport retries a request
// that carries a key and whose body can be sent again (GetBody), and only
// when the answer says the operation may be asked again: a transport error
// or timeout, a 503 (with or without Retry-After), 409 request-in-progress
// (after its Retry-After), 503 idempotency-store-unavailable and 503
// idempotency-capacity-exceeded (after its Retry-After). It stops
// with a *ProblemError on 422 idempotency-key-reused, on 409
// outcome-unknown (the caller must read the resource before it decides), on
// 503 idempotency-home-out-of-reach and idempotency-homes-disagree (a retry
// would meet the same refusal: the operator must act) and on any problem
// type it does not know. A replayed answer
// (Idempotent-Replayed: true) is final: see Replayed.
//
// The whole chain lives inside the request's context: its deadline bounds
// every attempt and every wait, no attempt starts after it and no wait is
// begun that would end after it. Waits grow exponentially with full jitter
// and the number of attempts is capped (Options.MaxAttempts).
// Options.AttemptTimeout bounds one attempt up to its response headers
// only: a body that streams slowly is read whole, within the request's
// context.
//
// A request without a key has no contract: it is sent once, and retried only
// when the connection was refused at dial time, before any byte of it was
// written (see Options and docs/client.md).
package idemclient
