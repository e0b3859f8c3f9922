package policy

import (
	"errors"
	"fmt"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// CheckStore refuses a set that needs an optional capability st lacks:
// wait_for_in_flight needs a store that can watch a record settle
// (idem.Watcher); without one every duplicate would be answered 409 at
// once, silently. Call it wherever a set is accepted (at start and on every
// reload), once the store is known.
func (s *Set) CheckStore(st idem.Store) error {
	_, watches := st.(idem.Watcher)
	var errs []error
	for _, p := range s.Policies {
		if p.WaitForInFlight > 0 && !watches {
			errs = append(errs, fmt.Errorf("policy %q sets wait_for_in_flight but the store (%T) cannot watch records", p.Name, st))
		}
	}
	return errors.Join(errs...)
}
