// Package scripts holds the Redis store's Lua scripts (docs/design.md
// §6.3), one file each, embedded; every file's header gives KEYS, ARGV and
// the reply. The store runs them (package redisstore), and so does a tool
// that must run exactly the store's scripts (the load tool's floor
// server).
package scripts

import (
	"embed"
	"strings"
)

//go:embed *.lua
var files embed.FS

// library is what every script starts with: the completed record's
// layouts, written and read in one place (record.lib). A script runs as
// one chunk (EVAL/EVALSHA), so it is put in front of each rather than
// loaded apart.
//
//go:embed record.lib
var library string

// Source returns the script named like its file without ".lua"
// ("reserve", "complete", …), the library in front of it (after a first
// line of flags, "#!lua …", which Redis reads only as the script's first
// line), or "" when there is none.
func Source(name string) string {
	b, err := files.ReadFile(name + ".lua")
	if err != nil {
		return ""
	}
	src := string(b)
	if strings.HasPrefix(src, "#!") {
		shebang, rest, _ := strings.Cut(src, "\n")
		return shebang + "\n" + library + rest
	}
	return library + src
}
