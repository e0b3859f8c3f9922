package policy

import (
	"net"
	"regexp"
	"strings"
)

// Request is what policies match on.
type Request struct {
	Method string
	// Authority is the :authority (host, perhaps with a port).
	Authority string
	// Path is the :path, query included.
	Path string
	// RouteName is Envoy's xds.route_name attribute, when sent.
	RouteName string
}

// Match selects requests. Every non-empty criterion must hold; within one
// criterion any listed value may match.
type Match struct {
	// RouteNames are Envoy route names (the xds.route_name attribute).
	RouteNames []string
	// Hosts are exact host names or "*.suffix" wildcards, compared with the
	// :authority without its port unless the pattern names one.
	Hosts []string
	// Methods are upper-case HTTP methods.
	Methods []string
	// PathExact, PathPrefix and PathRegex compare the path without its
	// query, as Envoy's route matching does. At most one is set.
	PathExact  string
	PathPrefix string
	PathRegex  *regexp.Regexp
	// JSON are body criteria (match.json): all must hold, judged once the
	// body is read (MatchBody); Matches ignores them.
	JSON []JSONCriterion
}

// Set is an ordered list of policies: the first that matches a request
// applies. A request no policy matches is not protected.
type Set struct {
	Policies []*Policy
	// Homes, when set, spreads the scopes' keys over several regions'
	// stores; every policy's Homes points to it.
	Homes *Homes
}

// DefaultSet holds only the default policy.
func DefaultSet() *Set { return &Set{Policies: []*Policy{Default()}} }

// Match returns the policy protecting r, or nil.
func (s *Set) Match(r Request) *Policy {
	for _, p := range s.Policies {
		if p.Match.Matches(r) {
			return p
		}
	}
	return nil
}

// Matches reports whether r meets every criterion of m.
func (m *Match) Matches(r Request) bool {
	if len(m.Methods) > 0 && !anyEqualFold(m.Methods, r.Method) {
		return false
	}
	if len(m.RouteNames) > 0 && !contains(m.RouteNames, r.RouteName) {
		return false
	}
	if len(m.Hosts) > 0 && !m.matchHost(r.Authority) {
		return false
	}
	path, _, _ := strings.Cut(r.Path, "?")
	switch {
	case m.PathExact != "":
		return path == m.PathExact
	case m.PathPrefix != "":
		return strings.HasPrefix(path, m.PathPrefix)
	case m.PathRegex != nil:
		return m.PathRegex.MatchString(path)
	}
	return true
}

func (m *Match) matchHost(authority string) bool {
	authority = strings.ToLower(authority)
	host := authority
	if h, _, err := net.SplitHostPort(authority); err == nil {
		host = h
	}
	for _, pat := range m.Hosts {
		candidate := host
		if strings.Contains(strings.TrimPrefix(pat, "["), ":") {
			candidate = authority // the pattern names a port
		}
		if suffix, ok := strings.CutPrefix(pat, "*"); ok {
			if strings.HasSuffix(candidate, suffix) && len(candidate) > len(suffix) {
				return true
			}
			continue
		}
		if candidate == pat {
			return true
		}
	}
	return false
}

func anyEqualFold(list []string, v string) bool {
	for _, x := range list {
		if strings.EqualFold(x, v) {
			return true
		}
	}
	return false
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
