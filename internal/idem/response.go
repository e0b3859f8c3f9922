package idem

// Origin says who made a response, which decides what it proves about the
// operation's effect.
type Origin uint8

const (
	// OriginUpstream: the application answered; its answer is a real one.
	OriginUpstream Origin = iota + 1
	// OriginNotSent: Envoy answered and the request provably never left it
	// (no route, no healthy host, connect failure, overflow, a filter before
	// the router refused it). internal/envoyorigin reads Envoy's signals.
	OriginNotSent
	// OriginMaybeSent: Envoy answered after the request may have reached
	// the upstream (timeout, reset): the effect may have happened.
	OriginMaybeSent
)

// EnumName is the name of an enum value v: names[v], or names[0] for a
// value past the table. An enum's names start with its zero value's:
// "invalid" where the values count from one, the default where zero is a
// setting.
func EnumName[E ~uint8](v E, names ...string) string {
	if int(v) >= len(names) {
		return names[0]
	}
	return names[v]
}

func (o Origin) String() string { return EnumName(o, "invalid", "upstream", "not_sent", "maybe_sent") }

// Action is what happens to a reserved record once a response is known.
type Action uint8

const (
	// ActionStore completes the record with the response.
	ActionStore Action = iota + 1
	// ActionRelease deletes the record so a retry runs the operation.
	ActionRelease
	// ActionUnknown marks the outcome unknown.
	ActionUnknown
)

func (a Action) String() string { return EnumName(a, "invalid", "store", "release", "unknown") }

// ParseAction reads an action's configuration name.
func ParseAction(s string) (Action, bool) {
	for _, a := range [...]Action{ActionStore, ActionRelease, ActionUnknown} {
		if a.String() == s {
			return a, true
		}
	}
	return 0, false
}

// ResponseRule maps responses of one origin and status range to an action.
type ResponseRule struct {
	Origin Origin
	// MinStatus and MaxStatus bound the status, both inclusive.
	MinStatus, MaxStatus int
	Action               Action
}

// DefaultResponseRules are docs/design.md §4's defaults: store the application's
// answers, but release on the statuses that ask the client to retry (408,
// 425, 429) and on Envoy replies that prove the request was never sent;
// Envoy replies after the request may have been sent are unknown.
func DefaultResponseRules() []ResponseRule {
	return []ResponseRule{
		{Origin: OriginUpstream, MinStatus: 408, MaxStatus: 408, Action: ActionRelease},
		{Origin: OriginUpstream, MinStatus: 425, MaxStatus: 425, Action: ActionRelease},
		{Origin: OriginUpstream, MinStatus: 429, MaxStatus: 429, Action: ActionRelease},
		{Origin: OriginUpstream, MinStatus: 100, MaxStatus: 599, Action: ActionStore},
		{Origin: OriginNotSent, MinStatus: 0, MaxStatus: 999, Action: ActionRelease},
		{Origin: OriginMaybeSent, MinStatus: 0, MaxStatus: 999, Action: ActionUnknown},
	}
}

// DecideResponse returns the first matching rule's action. A response no
// rule covers is unknown: when in doubt, never allow a second execution.
func DecideResponse(rules []ResponseRule, origin Origin, status int) Action {
	for _, r := range rules {
		if r.Origin == origin && status >= r.MinStatus && status <= r.MaxStatus {
			return r.Action
		}
	}
	return ActionUnknown
}
