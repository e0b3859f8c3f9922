package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

var _ idem.Admin = (*Store)(nil)

// Purge implements idem.Admin.
func (s *Store) Purge(ctx context.Context, id idem.RecordID) (err error) {
	defer s.recoverCall("purge", &err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	n, err := runScript(ctx, s.rdb, s.s.purge, []string{s.Key(id)}).Int()
	if err != nil {
		return fmt.Errorf("redisstore: purge: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("redisstore: purge: %w", idem.ErrNotFound)
	}
	return nil
}

// Resolve implements idem.Admin.
func (s *Store) Resolve(ctx context.Context, id idem.RecordID, resp *idem.Response, retention time.Duration) (err error) {
	defer s.recoverCall("resolve", &err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	args := []any{"release"}
	if resp != nil {
		args = []any{"complete", retention.Milliseconds(), encodeResponseHead(resp), resp.Body}
	}
	n, err := runScript(ctx, s.rdb, s.s.resolve, []string{s.Key(id)}, args...).Int()
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: resolve: %w", err)
	case n == 0:
		return fmt.Errorf("redisstore: resolve: %w", idem.ErrNotFound)
	case n < 0:
		return fmt.Errorf("redisstore: resolve: %w", idem.ErrNotUnknown)
	}
	return nil
}
