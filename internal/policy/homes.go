package policy

import (
	"strings"
	"time"
)

// Homes says which region's store arbitrates each scope's keys, for a
// fleet whose servers run in several regions, each with a store of its own
// (docs/regions.md). The uniqueness of a key holds across the fleet
// because every server asks the same store about it: its scope's home.
type Homes struct {
	// Epoch numbers the map; each change of it takes a larger one, so an
	// operator can tell which map a server holds (metrics, logs).
	Epoch int
	// Default is the home of scopes no rule names.
	Default string
	// Rules are tried in order; the first whose pattern matches the scope
	// gives its home.
	Rules []HomeRule
	// KeyClockSkew bounds how far a UUIDv7 key's time may be ahead of the
	// server's clock and still prove that the key is newer than a lost
	// region's failover (HomeRule.Lost).
	KeyClockSkew time.Duration
}

// HomeRule names the home of the scopes its patterns match.
type HomeRule struct {
	// Scopes are exact scopes, or prefixes written with a trailing '*'.
	Scopes []string
	Region string
	// MovedFrom is the region that was these scopes' home until MovedAt.
	// Until the window ends (MoveWindow), the home asks it about each key
	// first (a hand-over), so a key it holds is never reserved again.
	MovedFrom string
	MovedAt   time.Time
	// Lost declares MovedFrom lost (an operator's failover): when it
	// cannot be asked, a key it may have seen is answered as of unknown
	// outcome rather than run again.
	Lost bool
}

// Home is where one scope's keys are arbitrated.
type Home struct {
	Region string
	// From, when set, is the former home to hand each key over from, since
	// Since; Lost says it was declared lost.
	From  string
	Since time.Time
	Lost  bool
}

// MoveWindowMargin is added to a policy's retention to make the window of
// a move: a record the former home made before the move lives at most its
// retention after its attempt settles, and an attempt settles within its
// upstream's timeout, far less than this margin.
const MoveWindowMargin = time.Hour

// For returns the home of scope under p at now: its rule's region, and
// the former home while the move's window lasts. Before a move's time the
// former home is still the home: a move can be rolled out ahead of it.
func (h *Homes) For(p *Policy, scope string, now time.Time) Home {
	for i := range h.Rules {
		r := &h.Rules[i]
		if !r.matches(scope) {
			continue
		}
		if r.MovedFrom != "" && now.Before(r.MovedAt) {
			return Home{Region: r.MovedFrom}
		}
		home := Home{Region: r.Region}
		if r.MovedFrom != "" && now.Before(r.MovedAt.Add(p.Retention+MoveWindowMargin)) {
			home.From, home.Since, home.Lost = r.MovedFrom, r.MovedAt, r.Lost
		}
		return home
	}
	return Home{Region: h.Default}
}

// Regions lists every region the map names, each once.
func (h *Homes) Regions() []string {
	seen := map[string]bool{}
	var out []string
	add := func(r string) {
		if r != "" && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	add(h.Default)
	for _, r := range h.Rules {
		add(r.Region)
		add(r.MovedFrom)
	}
	return out
}

func (r *HomeRule) matches(scope string) bool {
	for _, s := range r.Scopes {
		if prefix, ok := strings.CutSuffix(s, "*"); ok {
			if strings.HasPrefix(scope, prefix) {
				return true
			}
		} else if s == scope {
			return true
		}
	}
	return false
}
