package daemon

import (
	"fmt"
	"slices"
	"strings"
)

// regionNames is --region-send-home: the regions Envoy has a home route
// for, separated by spaces or commas; the flag may be repeated. A request
// is sent only to a region named here, so a home region Envoy cannot route
// to is never sent to (its request would otherwise match the write route
// and run where it entered, unprotected).
type regionNames []string

func (r *regionNames) String() string { return strings.Join(*r, " ") }

func (r *regionNames) Set(v string) error {
	for _, name := range strings.FieldsFunc(v, func(c rune) bool { return c == ',' || c == ' ' }) {
		if slices.Contains(*r, name) {
			return fmt.Errorf("region %q is named twice", name)
		}
		*r = append(*r, name)
	}
	return nil
}
