package deploytest

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	matchingv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/matching/v3"
	skipv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/matcher/action/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// extensionWithMatcherURL is the type of a typed_config that wraps a filter
// in a matcher (Envoy's match_delegate filter).
var extensionWithMatcherURL = "type.googleapis.com/" + string((&matchingv3.ExtensionWithMatcher{}).ProtoReflect().Descriptor().FullName())

// unwrapMatcher returns the filter config an ExtensionWithMatcher wraps and
// the methods for which the match skips it, or tc itself and no methods.
//
// Envoy's match_delegate (source/extensions/filters/http/match_delegate/
// config.cc, DelegatingStreamFilter::FilterMatchState::evaluateMatchTree)
// evaluates the tree on the request headers; a match whose action is
// SkipFilter skips the wrapped filter for the whole stream, decoding and
// encoding; no match (and no on_no_match) runs it. Only what the shipped
// files use is evaluated here: matcher_list with :method header inputs,
// single, or, and and not predicates, string value matches, SkipFilter
// actions; anything else is an error rather than a guess.
func unwrapMatcher(tc *anypb.Any) (*anypb.Any, []string, error) {
	if tc.GetTypeUrl() != extensionWithMatcherURL {
		return tc, nil, nil
	}
	ewm, err := typedConfig[*matchingv3.ExtensionWithMatcher](tc)
	if err != nil {
		return nil, nil, err
	}
	if ewm.GetExtensionConfig().GetName() != extProcFilterName {
		return nil, nil, fmt.Errorf("ExtensionWithMatcher wraps %q, want %s", ewm.GetExtensionConfig().GetName(), extProcFilterName)
	}
	//lint:ignore SA1019 the deprecated Envoy matcher must stay unset: it is what is checked.
	if ewm.GetMatcher() != nil || ewm.GetXdsMatcher() == nil {
		return nil, nil, errors.New("ExtensionWithMatcher: use xds_matcher (the deprecated matcher is not evaluated here)")
	}
	var skipped []string
	for _, m := range httpMethods {
		skip, err := matcherSkips(ewm.GetXdsMatcher(), m)
		if err != nil {
			return nil, nil, fmt.Errorf("ExtensionWithMatcher: %w", err)
		}
		if skip {
			skipped = append(skipped, m)
		}
	}
	return ewm.GetExtensionConfig().GetTypedConfig(), skipped, nil
}

// matcherSkips evaluates m for a request with that method.
func matcherSkips(m *xdsmatcherv3.Matcher, method string) (bool, error) {
	if m.GetMatcherTree() != nil {
		return false, errors.New("matcher_tree is not evaluated here; use matcher_list")
	}
	for _, fm := range m.GetMatcherList().GetMatchers() {
		ok, err := predicateMatches(fm.GetPredicate(), method)
		if err != nil {
			return false, err
		}
		if ok {
			return actionSkips(fm.GetOnMatch())
		}
	}
	if m.GetOnNoMatch() != nil {
		return actionSkips(m.GetOnNoMatch())
	}
	return false, nil
}

func actionSkips(om *xdsmatcherv3.Matcher_OnMatch) (bool, error) {
	if om.GetMatcher() != nil {
		return false, errors.New("nested matchers are not evaluated here")
	}
	a := om.GetAction().GetTypedConfig()
	if _, err := typedConfig[*skipv3.SkipFilter](a); err != nil {
		return false, fmt.Errorf("action %s: only SkipFilter is evaluated here", a.GetTypeUrl())
	}
	return true, nil
}

func predicateMatches(p *xdsmatcherv3.Matcher_MatcherList_Predicate, method string) (bool, error) {
	switch {
	case p.GetSinglePredicate() != nil:
		sp := p.GetSinglePredicate()
		in, err := typedConfig[*matcherv3.HttpRequestHeaderMatchInput](sp.GetInput().GetTypedConfig())
		if err != nil || in.GetHeaderName() != ":method" {
			return false, fmt.Errorf("input %s: only the :method request header is evaluated here", sp.GetInput().GetName())
		}
		if sp.GetValueMatch() == nil {
			return false, errors.New("custom_match is not evaluated here")
		}
		return stringMatches(sp.GetValueMatch(), method)
	case p.GetOrMatcher() != nil:
		for _, q := range p.GetOrMatcher().GetPredicate() {
			ok, err := predicateMatches(q, method)
			if err != nil || ok {
				return ok, err
			}
		}
		return false, nil
	case p.GetAndMatcher() != nil:
		for _, q := range p.GetAndMatcher().GetPredicate() {
			ok, err := predicateMatches(q, method)
			if err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	case p.GetNotMatcher() != nil:
		ok, err := predicateMatches(p.GetNotMatcher(), method)
		return !ok, err
	}
	return false, fmt.Errorf("predicate %v is not evaluated here", p)
}

// stringMatches is xds's StringMatcher on a value that is present.
func stringMatches(sm *xdsmatcherv3.StringMatcher, v string) (bool, error) {
	fold := func(s string) string {
		if sm.GetIgnoreCase() {
			return strings.ToLower(s)
		}
		return s
	}
	switch sm.GetMatchPattern().(type) {
	case *xdsmatcherv3.StringMatcher_Exact:
		return fold(v) == fold(sm.GetExact()), nil
	case *xdsmatcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(sm.GetPrefix())), nil
	case *xdsmatcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(v), fold(sm.GetSuffix())), nil
	case *xdsmatcherv3.StringMatcher_Contains:
		return strings.Contains(fold(v), fold(sm.GetContains())), nil
	case *xdsmatcherv3.StringMatcher_SafeRegex:
		re, err := regexp.Compile(`^(?:` + sm.GetSafeRegex().GetRegex() + `)$`) // the whole value, as RE2 FullMatch
		if err != nil {
			return false, err
		}
		return re.MatchString(v), nil
	}
	return false, fmt.Errorf("string matcher %v is not evaluated here", sm)
}

// TestMatcherSkipsEvaluatesPredicates pins the evaluator on the forms the
// shipped sidecar does not use, so that a file switching to them is
// judged right: a regex that must match the whole value, not and and
// predicates, on_no_match, and refusals of what is not evaluated.
func TestMatcherSkipsEvaluatesPredicates(t *testing.T) {
	input := &corev3.TypedExtensionConfig{Name: "m", TypedConfig: mustAny(t, &matcherv3.HttpRequestHeaderMatchInput{HeaderName: ":method"})}
	skip := &xdsmatcherv3.Matcher_OnMatch{OnMatch: &xdsmatcherv3.Matcher_OnMatch_Action{
		Action: &corev3.TypedExtensionConfig{Name: "skip", TypedConfig: mustAny(t, &skipv3.SkipFilter{})}}}
	single := func(sm *xdsmatcherv3.StringMatcher) *xdsmatcherv3.Matcher_MatcherList_Predicate {
		return &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate_{
			SinglePredicate: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate{
				Input: input, Matcher: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate_ValueMatch{ValueMatch: sm}}}}
	}
	regex := func(re string) *xdsmatcherv3.StringMatcher {
		return &xdsmatcherv3.StringMatcher{MatchPattern: &xdsmatcherv3.StringMatcher_SafeRegex{SafeRegex: &xdsmatcherv3.RegexMatcher{Regex: re}}}
	}
	list := func(p *xdsmatcherv3.Matcher_MatcherList_Predicate) *xdsmatcherv3.Matcher {
		return &xdsmatcherv3.Matcher{MatcherType: &xdsmatcherv3.Matcher_MatcherList_{MatcherList: &xdsmatcherv3.Matcher_MatcherList{
			Matchers: []*xdsmatcherv3.Matcher_MatcherList_FieldMatcher{{Predicate: p, OnMatch: skip}}}}}
	}
	skipsFor := func(m *xdsmatcherv3.Matcher) []string {
		t.Helper()
		var out []string
		for _, method := range httpMethods {
			ok, err := matcherSkips(m, method)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				out = append(out, method)
			}
		}
		return out
	}
	if got := skipsFor(list(single(regex("GET|HEAD")))); !slices.Equal(got, []string{"GET", "HEAD"}) {
		t.Errorf("regex GET|HEAD skips %v", got)
	}
	if got := skipsFor(list(single(regex("GE")))); len(got) != 0 {
		t.Errorf("regex GE must match the whole value, skips %v", got)
	}
	not := &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_NotMatcher{NotMatcher: single(regex("POST|PUT|PATCH|DELETE"))}}
	if got := skipsFor(list(not)); slices.Contains(got, "POST") || !slices.Contains(got, "GET") {
		t.Errorf("not(writes) skips %v", got)
	}
	and := &xdsmatcherv3.Matcher_MatcherList_Predicate{MatchType: &xdsmatcherv3.Matcher_MatcherList_Predicate_AndMatcher{
		AndMatcher: &xdsmatcherv3.Matcher_MatcherList_Predicate_PredicateList{Predicate: []*xdsmatcherv3.Matcher_MatcherList_Predicate{
			single(regex("GET|POST")), single(regex("POST|PUT"))}}}}
	if got := skipsFor(list(and)); !slices.Equal(got, []string{"POST"}) {
		t.Errorf("and skips %v", got)
	}
	noMatch := &xdsmatcherv3.Matcher{OnNoMatch: skip}
	if got := skipsFor(noMatch); len(got) != len(httpMethods) {
		t.Errorf("on_no_match skip skips %v", got)
	}
	tree := &xdsmatcherv3.Matcher{MatcherType: &xdsmatcherv3.Matcher_MatcherTree_{MatcherTree: &xdsmatcherv3.Matcher_MatcherTree{}}}
	if _, err := matcherSkips(tree, "GET"); err == nil {
		t.Error("a matcher_tree was evaluated instead of refused")
	}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
