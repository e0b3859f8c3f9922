package deploytest

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	corev1 "k8s.io/api/core/v1"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// principalAttribute is the mTLS peer identity in Envoy's CEL vocabulary
// (source/extensions/filters/common/expr/context.h: the connection
// attributes uri_san_peer_certificate, dns_san_peer_certificate,
// subject_peer_certificate). Envoy has no source.principal: source has only
// address and port, and an unknown attribute is silently left out, so a
// filter asking for it gives a principal policy nothing but 401s.
const (
	principalAttribute  = "connection.uri_san_peer_certificate"
	inventedAttribute   = "source.principal"
	examplePoliciesFile = "examples/policies.yaml"
)

// filterNeeds is what a set of policies asks of the filter serving them.
type filterNeeds struct {
	// where names the policy file, for messages.
	where string
	// maxWait is the longest wait_for_in_flight.
	maxWait time.Duration
	// principal: some policy scopes keys by the mTLS identity.
	principal bool
	// maxBody is the largest max_request_body or max_stored_body: the
	// proxy's buffer must hold that much, both ways.
	maxBody int
}

// needsOf sums up what set asks of its filter.
func needsOf(where string, set *policy.Set) filterNeeds {
	n := filterNeeds{where: where}
	for _, p := range set.Policies {
		n.maxWait = max(n.maxWait, p.WaitForInFlight)
		n.principal = n.principal || p.Scope.Source == policy.ScopePrincipal
		n.maxBody = max(n.maxBody, p.MaxRequestBody, p.MaxStoredBody)
	}
	return n
}

// examplePolicyNeeds: the plain Envoy files are written for the policies
// of examples/policies.yaml (envoy-jwt.yaml forwards the jwt_authn payload
// its payments policy scopes by; docs/configuration.md points there for every
// option), so they must serve every one of them.
func examplePolicyNeeds() (filterNeeds, error) {
	set, err := config.Load(filepath.Join(repoRoot, examplePoliciesFile))
	if err != nil {
		return filterNeeds{}, err
	}
	return needsOf(examplePoliciesFile, set), nil
}

// overrideWanted is the message timeout the server asks for while a
// duplicate waits the whole wait_for_in_flight: the wait, its two store
// calls and the server's own budget (internal/attempt decide.go
// extension; internal/extproc render.go, override_message_timeout). Under
// a smaller max_message_timeout the server shortens the wait.
func overrideWanted(wait, storeTimeout time.Duration) time.Duration {
	return wait + 3*storeTimeout
}

// checkFilterServes checks that filter c gives the policies what they need:
//   - wait_for_in_flight: the server's override_message_timeout is honoured
//     only when it is within 1 ms..max_message_timeout, and
//     max_message_timeout defaults to 0 (ext_proc.cc Filter::onNewTimeout,
//     "out of config range. Ignoring the message"; config.cc
//     DefaultMaxMessageTimeoutMs = 0), so without it every wait ends at
//     message_timeout in Envoy's own error reply;
//   - principal scope: the mTLS identity attribute is requested;
//   - no filter asks for source.principal, which Envoy does not have.
func checkFilterServes(c *extprocv3.ExternalProcessor, n filterNeeds, storeTimeout time.Duration) error {
	var errs []error
	if n.maxWait > 0 {
		want := overrideWanted(n.maxWait, storeTimeout)
		if got := c.GetMaxMessageTimeout().AsDuration(); got < want {
			errs = append(errs, fmt.Errorf("max_message_timeout is %v but a policy of %s waits %v for an attempt in flight: "+
				"the server asks for %v (override_message_timeout), which Envoy ignores above max_message_timeout, and the wait ends in Envoy's error reply",
				got, n.where, n.maxWait, want))
		}
	}
	attrs := append(slices.Clone(c.GetRequestAttributes()), c.GetResponseAttributes()...)
	if n.principal && !slices.Contains(c.GetRequestAttributes(), principalAttribute) {
		errs = append(errs, fmt.Errorf("a policy of %s scopes keys by principal: request_attributes lacks %s (Envoy's mTLS peer identity)",
			n.where, principalAttribute))
	}
	if slices.Contains(attrs, inventedAttribute) {
		errs = append(errs, fmt.Errorf("%s is not an Envoy attribute (Envoy omits it silently); the mTLS identity is %s",
			inventedAttribute, principalAttribute))
	}
	return errors.Join(errs...)
}

// serverPolicyNeeds is what the policy file the server's pods mount asks
// of the filters in front of them (the ConfigMap checkPolicyConfigMap
// checks).
func serverPolicyNeeds(objs []k8sObject) (filterNeeds, error) {
	srv, err := findServer(objs)
	if err != nil {
		return filterNeeds{}, err
	}
	for _, v := range srv.dep.Spec.Template.Spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		cm := objectNamed[corev1.ConfigMap](objs, serverNamespace, v.ConfigMap.Name)
		if cm == nil || cm.Data[policyKey] == "" {
			continue
		}
		where := "ConfigMap " + cm.Name
		set, err := config.Parse(where+" "+policyKey, []byte(cm.Data[policyKey]))
		if err != nil {
			return filterNeeds{}, err
		}
		return needsOf(where, set), nil
	}
	return filterNeeds{}, fmt.Errorf("no ConfigMap with %s is mounted into the server's pods", policyKey)
}
