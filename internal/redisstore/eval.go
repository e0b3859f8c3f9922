package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// evalFunc makes one script call on c: (*redis.Script).EvalSha or Eval.
type evalFunc = func(sc *redis.Script, ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd

// evalScripts is how every script call of the store is sent. send makes
// its calls by their SHA1 (EVALSHA: a few bytes instead of the script) and
// reports whether Redis answered any of them NOSCRIPT. A Redis that
// restarted or failed over has forgotten the scripts, so send is then
// called once more, to make those calls whole (EVAL, which loads the
// script for the calls after): what go-redis's Script.Run does for one
// command (go-redis v9 script.go), here for a pipeline too.
func evalScripts(send func(eval evalFunc) (noScript bool)) {
	if send((*redis.Script).EvalSha) {
		send((*redis.Script).Eval)
	}
}

// runScript runs sc on keys as one command of c.
func runScript(ctx context.Context, c redis.Scripter, sc *redis.Script, keys []string, args ...any) (cmd *redis.Cmd) {
	evalScripts(func(eval evalFunc) bool {
		cmd = eval(sc, ctx, c, keys, args...)
		return isNoScript(cmd.Err())
	})
	return cmd
}
