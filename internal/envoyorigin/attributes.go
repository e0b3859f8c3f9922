package envoyorigin

import "github.com/idem-extproc/idem-extproc/internal/policy"

// The attributes the server reads, named as Envoy's CEL context defines them
// (source/extensions/filters/common/expr/context.h): an attribute the filter
// was not asked for, or one Envoy does not define, is simply absent from the
// message (ExpressionManager::evaluateAttributes in ext_proc's
// matching_utils.cc skips an expression that evaluates to an error).
const (
	AttrCodeDetails = "response.code_details"
	AttrFlags       = "response.flags"
	// AttrAttemptCount is how many upstream attempts the router made:
	// context.h Upstream "upstream" + UpstreamRequestAttemptCount
	// "request_attempt_count", a uint read from StreamInfo::attemptCount().
	// The router sets it to 1 before the first attempt and increments it in
	// doRetry (router.cc decodeHeaders, doRetry); 0 when the router never
	// made an attempt. It is in context.cc on Envoy's main of 2026; the first
	// release that carries it was not confirmed in the source read here.
	AttrAttemptCount = "upstream.request_attempt_count"
	AttrRouteName    = "xds.route_name"
	// The downstream peer certificate's first URI SAN, first DNS SAN and
	// subject (context.cc SslExtractorsValues: URISanPeerCertificate,
	// DNSSanPeerCertificate, SubjectPeerCertificate); absent without TLS.
	AttrURISanPeer  = "connection.uri_san_peer_certificate"
	AttrDNSSanPeer  = "connection.dns_san_peer_certificate"
	AttrSubjectPeer = "connection.subject_peer_certificate"
)

// PeerAttr is the attribute that carries the peer identity id.
func PeerAttr(id policy.PeerIdentity) string {
	switch id {
	case policy.PeerDNSSAN:
		return AttrDNSSanPeer
	case policy.PeerSubject:
		return AttrSubjectPeer
	}
	return AttrURISanPeer
}

// MissingAttributes are the attributes whose absence the server reports
// (extproc.EnvoyObserver.MissingAttribute), each with the filter setting that sends it.
var MissingAttributes = map[string]string{
	AttrCodeDetails:  "response_attributes",
	AttrAttemptCount: "response_attributes",
	AttrRouteName:    "request_attributes",
	AttrURISanPeer:   "request_attributes",
	AttrDNSSanPeer:   "request_attributes",
	AttrSubjectPeer:  "request_attributes",
}
