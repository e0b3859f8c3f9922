package redisstore

import (
	"fmt"
	"runtime"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// NewClient opens one go-redis UniversalClient for a URL of any accepted
// form (URLForms): a single server, a Sentinel-managed primary, or a
// Cluster. Its timeouts suit a caller that must answer within Envoy's
// message_timeout, whatever the topology:
//
//   - every call takes its deadline from the context (the store bounds
//     each one by its CallTimeout), and dial, read, write and pool waits
//     are each bounded by callTimeout too;
//   - a refused dial is not retried at length (one dialer retry);
//   - a failed command is retried at most twice, after 2–10 ms, and never
//     past the context's deadline. Retrying is safe because every command
//     the store sends is a read (HGETALL, PING) or a script that checks the
//     attempt's token and does nothing new when repeated (see store.go);
//   - Cluster redirections (MOVED, ASK) are followed at most three times,
//     also within the deadline.
func NewClient(rawURL string, callTimeout time.Duration) (redis.UniversalClient, error) {
	return NewSecureClient(rawURL, callTimeout, Security{})
}

// NewSecureClient is NewClient with credentials and TLS material read from
// files (see Security).
func NewSecureClient(rawURL string, callTimeout time.Duration, sec Security) (redis.UniversalClient, error) {
	return newClient(rawURL, callTimeout, sec, 0)
}

// NewRemoteClient is NewSecureClient for a store in another region: it
// keeps idle connections open, at least minIdle per node, so that a call
// rarely pays for opening one (two round trips or more, which a budget
// made of the region's round trip does not cover twice).
func NewRemoteClient(rawURL string, callTimeout time.Duration, sec Security, minIdle int) (redis.UniversalClient, error) {
	return newClient(rawURL, callTimeout, sec, minIdle)
}

func newClient(rawURL string, callTimeout time.Duration, sec Security, minIdle int) (redis.UniversalClient, error) {
	_, simple, multi, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if callTimeout <= 0 {
		callTimeout = idem.DefaultStoreTimeout
	}
	if err := sec.apply(simple, multi); err != nil {
		return nil, err
	}
	// One budget for every connection of the client, whatever the
	// topology (guard.go).
	budget := newReplyBudget(DefaultMaxReply)
	if simple != nil {
		simple.Dialer = guardedDialer(callTimeout, simple.TLSConfig, budget)
		simple.ContextTimeoutEnabled = true
		simple.DialTimeout = callTimeout
		simple.ReadTimeout = callTimeout
		simple.WriteTimeout = callTimeout
		simple.DialerRetries = 1
		simple.MaxRetries = maxRetries
		simple.MinRetryBackoff = minRetryBackoff
		simple.MaxRetryBackoff = maxRetryBackoff
		simple.PoolTimeout = callTimeout
		// Each open stream makes at most one call at a time; a pool
		// smaller than the concurrent streams makes them queue for a
		// connection inside their budget.
		simple.PoolSize = max(simple.PoolSize, minPoolSize())
		simple.MinIdleConns = max(simple.MinIdleConns, minIdle)
		// CLIENT SETINFO on every new connection is noise in INFO
		// commandstats and buys nothing here.
		simple.DisableIdentity = true
		simple.MaintNotificationsConfig = noMaintNotifications()
		return redis.NewClient(simple), nil
	}
	multi.Dialer = guardedDialer(callTimeout, multi.TLSConfig, budget)
	multi.ContextTimeoutEnabled = true
	multi.DialTimeout = callTimeout
	multi.ReadTimeout = callTimeout
	multi.WriteTimeout = callTimeout
	multi.DialerRetries = 1
	multi.MaxRetries = maxRetries
	multi.MinRetryBackoff = minRetryBackoff
	multi.MaxRetryBackoff = maxRetryBackoff
	multi.MaxRedirects = 3
	multi.PoolTimeout = callTimeout
	multi.PoolSize = max(multi.PoolSize, minPoolSize())
	multi.MinIdleConns = max(multi.MinIdleConns, minIdle)
	multi.DisableIdentity = true
	multi.MaintNotificationsConfig = noMaintNotifications()
	if multi.IsClusterMode {
		co := multi.Cluster()
		// go-redis's routing policies need the server's COMMAND table,
		// which it fetches on a client's first command with a five-second
		// context of its own, ignoring the caller's budget, and with every
		// other caller queued behind it. The store needs none of it: each
		// of its commands names one key (a hash-tagged record), routed by
		// slot, and the one keyless command, WAIT, goes to the key's
		// primary by hand (durable.go).
		co.DisableRoutingPolicies = true
		return redis.NewClusterClient(co), nil
	}
	return redis.NewUniversalClient(multi), nil
}

// noMaintNotifications turns off go-redis's maintenance notifications (a
// Redis Enterprise feature this store does not use). Left on "auto", the
// first connection of each client writes the mode back into the options
// that every redis.Conn of that client shares under its own lock: a data
// race between the connections a durable reservation takes (go-redis
// v9.23 redis.go initConn).
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// The retry policy NewClient applies to every topology.
const (
	maxRetries      = 2
	minRetryBackoff = 2 * time.Millisecond
	maxRetryBackoff = 10 * time.Millisecond
)

// minPoolSize is the smallest connection pool per node: enough for the
// streams a busy server has open at once.
func minPoolSize() int { return max(64, 10*runtime.GOMAXPROCS(0)) }

// apply puts the password file and the TLS material of sec into the
// options of one topology (simple for a standalone server, multi for the
// others), checked against the URL's scheme.
func (sec Security) apply(simple *redis.Options, multi *redis.UniversalOptions) error {
	if !sec.any() {
		return nil
	}
	tlsURL := (simple != nil && simple.TLSConfig != nil) || (multi != nil && multi.TLSConfig != nil)
	if err := sec.check(tlsURL); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	var err error
	if simple != nil {
		if sec.PasswordFile != "" {
			simple.CredentialsProviderContext = sec.credentials(simple.Username)
		}
		if simple.TLSConfig != nil {
			simple.TLSConfig, err = sec.tlsConfig(simple.TLSConfig)
		}
		return err
	}
	if sec.PasswordFile != "" {
		multi.CredentialsProviderContext = sec.credentials(multi.Username)
	}
	if multi.TLSConfig != nil {
		multi.TLSConfig, err = sec.tlsConfig(multi.TLSConfig)
	}
	return err
}
