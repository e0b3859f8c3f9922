package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/redis/go-redis/v9"
)

// PanicError is a store call's error when something under it panicked:
// the call fails, as for a broken connection, and the process goes on.
type PanicError struct {
	Op    string
	Value any
}

func (e *PanicError) Error() string { return fmt.Sprintf("redisstore: %s: panic: %v", e.Op, e.Value) }

// StoreFailure names the error in the store failure metric.
func (e *PanicError) StoreFailure() string { return "panic" }

// panicked logs a recovered panic once, with the stack that raised it
// (recover runs on top of the panicking frames), and returns the call's
// error.
func panicked(log *slog.Logger, op string, v any) error {
	log.Error("redis store call panicked; the call fails, the process goes on",
		slog.String("op", op), slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))
	return &PanicError{Op: op, Value: v}
}

// recoverCall ends a store call that panicked with a PanicError in *err.
// It must be deferred directly by the exported method.
func (s *Store) recoverCall(op string, err *error) {
	if v := recover(); v != nil {
		*err = panicked(s.log, op, v)
	}
}

// failedCmd is a script call's reply when running it panicked.
func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
