package idem

import "time"

// DefaultStoreTimeout is the budget of one store call made while Envoy
// waits: the server's per-call budget, the Redis client's per-command
// timeout and the --store-timeout default all start from it. It must stay
// under the ext_proc filter's message_timeout (200 ms by default) so that
// a slow store is answered with a 503 problem, not an Envoy timeout.
const DefaultStoreTimeout = 100 * time.Millisecond
