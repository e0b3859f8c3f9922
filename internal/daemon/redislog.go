package daemon

import (
	"context"
	"fmt"
	"log/slog"
)

// redisLog takes go-redis's own messages (a dial that failed, a pool
// event) into the daemon's structured log at debug level. go-redis would
// otherwise print free-form lines to stderr, one per failed dial during an
// outage, among the JSON ones; what matters of an outage already reaches
// the log as readiness warnings and store errors.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	if l.log.Enabled(ctx, slog.LevelDebug) {
		l.log.LogAttrs(ctx, slog.LevelDebug, "redis client", slog.String("detail", fmt.Sprintf(format, v...)))
	}
}
