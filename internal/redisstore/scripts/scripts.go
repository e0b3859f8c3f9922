// Package scripts holds the Redis store's Lua scripts (docs/design.md
// §6.3), one file each, embedded; every file's header gives KEYS, ARGV and
// the reply. The store runs them (package redisstore), and so does a tool
// that must run exactly the store's scripts (the load tool's floor
// server).
package scripts

import "embed"

//go:embed *.lua
var files embed.FS

// Source returns the script named like its file without ".lua"
// ("reserve", "complete", …), or "" when there is none.
func Source(name string) string {
	b, err := files.ReadFile(name + ".lua")
	if err != nil {
		return ""
	}
	return string(b)
}
