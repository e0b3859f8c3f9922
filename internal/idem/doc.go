// Package idem holds the idempotency contract: record states, the
// transitions between them, the request-time and response-time decisions,
// and the Store interface that the Redis and in-memory stores implement.
//
// The contract (docs/design.md, the project's design document) names one
// operation across attempts by (policy, scope, Idempotency-Key). The first
// attempt reserves the record with a random token; every later transition
// must present that token, so an old attempt can never overwrite a newer
// one's record. The transition functions in transition.go are the single
// statement of those rules: the in-memory store calls them under a lock and
// the Redis store's Lua scripts mirror them; one contract suite
// (package storetest) holds both to the same behaviour.
package idem
