package redisstore

import (
	"fmt"
	"runtime"
	"time"

	"github.com/redis/go-redis/v9"
)

// NewClient opens a client for a redis:// or rediss:// URL
// (redis://[user:pass@]host:port/db). Its timeouts suit a caller that must
// answer within Envoy's message_timeout: calls take their deadline from the
// context, a refused dial is not retried at length, and retries (safe: every
// script is idempotent for its token) back off briefly.
func NewClient(rawURL string, callTimeout time.Duration) (redis.UniversalClient, error) {
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if callTimeout <= 0 {
		callTimeout = DefaultCallTimeout
	}
	opts.ContextTimeoutEnabled = true
	opts.DialTimeout = callTimeout
	opts.ReadTimeout = callTimeout
	opts.WriteTimeout = callTimeout
	opts.DialerRetries = 1
	opts.MaxRetries = 2
	opts.MinRetryBackoff = 2 * time.Millisecond
	opts.MaxRetryBackoff = 10 * time.Millisecond
	opts.PoolTimeout = callTimeout
	// Each open stream makes at most one call at a time; a pool smaller
	// than the concurrent streams makes them queue for a connection
	// inside their budget.
	opts.PoolSize = max(opts.PoolSize, 64, 10*runtime.GOMAXPROCS(0))
	// CLIENT SETINFO on every new connection is noise in INFO commandstats
	// and buys nothing here.
	opts.DisableIdentity = true
	return redis.NewClient(opts), nil
}
