package region

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// refused is the store of a home this server cannot use: every call fails
// before anything is asked, so nothing is left to cancel.
type refused struct {
	err    error
	budget time.Duration
}

func (r refused) Budget() time.Duration { return r.budget }

func (r refused) fail() error { return fmt.Errorf("%w: %w", idem.ErrRefused, r.err) }

func (r refused) Reserve(context.Context, idem.Reservation) (idem.ReserveResult, error) {
	return idem.ReserveResult{}, r.fail()
}
func (r refused) Renew(context.Context, idem.RecordID, idem.Token, time.Duration) error {
	return r.fail()
}
func (r refused) Complete(context.Context, idem.RecordID, idem.Token, idem.Response, time.Duration) error {
	return r.fail()
}
func (r refused) Release(context.Context, idem.RecordID, idem.Token) error { return r.fail() }
func (r refused) MarkUnknown(context.Context, idem.RecordID, idem.Token, time.Duration) error {
	return r.fail()
}
func (r refused) Cancel(context.Context, idem.RecordID, idem.Token, time.Duration) (idem.CancelResult, error) {
	return 0, r.fail()
}
func (r refused) Get(context.Context, idem.RecordID) (idem.Record, error) {
	return idem.Record{}, r.fail()
}
func (r refused) Ping(context.Context) error { return r.fail() }

type nopObserver struct{}

func (nopObserver) HandedOver(string, string)                      {}
func (nopObserver) Moved(string)                                   {}
func (nopObserver) Quarantined(string)                             {}
func (nopObserver) StoreCall(string, string, error, time.Duration) {}
func (nopObserver) OutOfReach(string)                              {}
