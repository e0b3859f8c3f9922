package redisstore

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/redis/go-redis/v9"
)

// The one place Redis's answers are told apart. Each class is read with
// go-redis's typed helpers (go-redis v9 error.go: IsLoadingError, ...,
// which also match a wrapped error), never by the text of the reply; what
// the store does about each class is decided by its callers below.

// errClass is what an error from a Redis call says about the node and the
// call.
type errClass uint8

const (
	errNone errClass = iota
	// errContext: the caller's context ended; nothing is said of Redis.
	errContext
	// errConn: no reply, the connection broke or could not be made (EOF,
	// reset, refused). errTimeout: no reply in time.
	errConn
	errTimeout
	// errBusy: the node cannot serve the key right now, and says so:
	// LOADING, CLUSTERDOWN, TRYAGAIN, MASTERDOWN.
	errBusy
	// errReadOnly: READONLY, a primary demoted to a replica.
	errReadOnly
	// errRedirect: MOVED or ASK, the slot is served elsewhere.
	errRedirect
	// errNoReplicas: NOREPLICAS, fewer replicas acknowledged than asked.
	errNoReplicas
	// errMaxClients: the node refuses new clients.
	errMaxClients
	// errOOM: a write refused at maxmemory under noeviction.
	errOOM
	// errNoScript: an EVALSHA of a script the node does not hold.
	errNoScript
	// errWrongType: a command for one type on a key of another.
	errWrongType
	// errReply: any other reply of Redis's.
	errReply
)

// classify names err's class.
func classify(err error) errClass {
	switch {
	case err == nil:
		return errNone
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errContext
	case redis.IsLoadingError(err), redis.IsClusterDownError(err), redis.IsTryAgainError(err), redis.IsMasterDownError(err):
		return errBusy
	case redis.IsReadOnlyError(err):
		return errReadOnly
	case redis.IsNoReplicasError(err):
		return errNoReplicas
	case redis.IsMaxClientsError(err):
		return errMaxClients
	case redis.IsOOMError(err):
		return errOOM
	case redis.HasErrorPrefix(err, "NOSCRIPT"): // redis.ErrNoScript's text; go-redis has no helper
		return errNoScript
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		return errWrongType
	}
	if _, ok := redis.IsMovedError(err); ok {
		return errRedirect
	}
	if _, ok := redis.IsAskError(err); ok {
		return errRedirect
	}
	var re redis.Error
	if errors.As(err, &re) {
		return errReply
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return errTimeout
	}
	return errConn
}

// retryAlone reports the errors after which go-redis would have retried a
// lone command (go-redis v9 error.go, shouldRetry): a connection that
// broke or could not be made, or a reply saying the node cannot serve the
// key right now. Context errors are not among them.
func retryAlone(err error) bool {
	switch classify(err) {
	case errConn, errTimeout, errBusy, errReadOnly, errNoReplicas, errMaxClients:
		return true
	}
	return false
}

// topologyChanged reports errors after which the key's primary may be
// elsewhere now: a redirection, a demoted or loading node, or a connection
// that broke (not one that only timed out).
func topologyChanged(err error) bool {
	switch classify(err) {
	case errRedirect, errReadOnly, errBusy:
		return true
	case errConn:
		var ne net.Error
		return errors.Is(err, io.EOF) || errors.As(err, &ne)
	}
	return false
}

// isOOM reports Redis refusing a write at maxmemory under noeviction.
func isOOM(err error) bool { return classify(err) == errOOM }

// isNoScript reports Redis's answer to an EVALSHA of a script it does not
// hold.
func isNoScript(err error) bool { return classify(err) == errNoScript }

// isWrongType reports a command for one type on a key of another.
func isWrongType(err error) bool { return classify(err) == errWrongType }
