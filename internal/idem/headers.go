package idem

// The contract's own HTTP header fields, one spelling each for the server
// and the client (idemclient). They are in lower case, as HTTP/2 requires
// on the wire and Envoy's header maps carry them (RFC 9113 §8.2.1); field
// names compare case-insensitively (RFC 9110 §5.1), as net/http's
// Header.Get and Header.Set do.
const (
	// KeyHeader carries the operation key
	// (draft-ietf-httpapi-idempotency-key-header); the header a policy
	// reads by default.
	KeyHeader = "idempotency-key"
	// ReplayedHeader marks an answer served from a stored record.
	ReplayedHeader = "idempotent-replayed"
	// BodyOmittedHeader marks a replay whose original body was too large
	// to store: the operation completed, but its body cannot be repeated.
	BodyOmittedHeader = "idempotent-body-omitted"
)
