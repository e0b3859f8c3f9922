package redisstore

import (
	"context"
	"slices"

	"github.com/redis/go-redis/v9"
)

// scriptCall is one call of a script on one record's keys, and its reply.
// ctx and done serve a call queued for a batch (batch.go).
type scriptCall struct {
	ctx  context.Context
	sc   *redis.Script
	keys []string
	args []any
	cmd  *redis.Cmd    // the reply; for a batch's call, set before done is closed
	done chan struct{} // closed once cmd is set
}

// runScripts is how every script call of the store is made: on c, a
// client on which each call is one command, or a pipeline that flush
// sends (with any command of its own queued after the calls). Each call
// goes by its script's SHA1 (EVALSHA: a few bytes instead of the script;
// redis.NewScript hashes it in Go, never asking Redis, go-redis v9.23
// script.go). A Redis that restarted or failed over has forgotten the
// scripts and answers NOSCRIPT: the calls so answered are made once more,
// whole (EVAL, which also puts the script in the node's cache for the
// calls after: Redis src/eval.c, evalGenericCommand and luaScriptsLRUAdd;
// past 500 scripts loaded so, the least recently used is dropped, and its
// next call is answered NOSCRIPT and made whole again here), and flush runs
// again. That is go-redis's Script.Run for one command (script.go: EvalSha,
// then Eval when isNoScriptErr), here for a pipeline too.
func runScripts(ctx context.Context, c redis.Scripter, calls []*scriptCall, flush func()) {
	noScript := func(call *scriptCall) bool { return isNoScript(call.cmd.Err()) }
	eval := (*redis.Script).EvalSha
	for again := false; ; again = true {
		for _, call := range calls {
			if !again || noScript(call) {
				call.cmd = eval(call.sc, ctx, c, call.keys, call.args...)
			}
		}
		if flush != nil {
			flush()
		}
		if again || !slices.ContainsFunc(calls, noScript) {
			return
		}
		eval = (*redis.Script).Eval
	}
}

// runScript runs sc on keys as one command of c.
func runScript(ctx context.Context, c redis.Scripter, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	call := scriptCall{sc: sc, keys: keys, args: args}
	runScripts(ctx, c, []*scriptCall{&call}, nil)
	return call.cmd
}
