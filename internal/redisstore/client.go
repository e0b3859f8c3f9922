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
	_, o, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if callTimeout <= 0 {
		callTimeout = idem.DefaultStoreTimeout
	}
	if err := sec.apply(o); err != nil {
		return nil, err
	}
	// One budget for every connection of the client, whatever the
	// topology (guard.go).
	o.Dialer = guardedDialer(callTimeout, o.TLSConfig, newReplyBudget(DefaultMaxReply))
	o.ContextTimeoutEnabled = true
	o.DialTimeout = callTimeout
	o.ReadTimeout = callTimeout
	o.WriteTimeout = callTimeout
	o.DialerRetries = 1
	o.MaxRetries = maxRetries
	o.MinRetryBackoff = minRetryBackoff
	o.MaxRetryBackoff = maxRetryBackoff
	o.MaxRedirects = 3
	o.PoolTimeout = callTimeout
	// Each open stream makes at most one call at a time; a pool smaller
	// than the concurrent streams makes them queue for a connection inside
	// their budget.
	o.PoolSize = max(o.PoolSize, minPoolSize())
	o.MinIdleConns = max(o.MinIdleConns, minIdle)
	// CLIENT SETINFO on every new connection is noise in INFO commandstats
	// and buys nothing here.
	o.DisableIdentity = true
	o.MaintNotificationsConfig = noMaintNotifications()
	if o.IsClusterMode {
		co := o.Cluster()
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
	return redis.NewUniversalClient(o), nil
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

// apply puts the password file and the TLS material of sec into o,
// checked against the URL's scheme.
func (sec Security) apply(o *redis.UniversalOptions) error {
	if !sec.any() {
		return nil
	}
	if err := sec.check(o.TLSConfig != nil); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if sec.PasswordFile != "" {
		o.CredentialsProviderContext = sec.credentials(o.Username)
	}
	var err error
	if o.TLSConfig != nil {
		o.TLSConfig, err = sec.tlsConfig(o.TLSConfig)
	}
	return err
}
