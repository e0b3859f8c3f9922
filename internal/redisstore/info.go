package redisstore

import "strings"

// InfoField returns one field of a reply in Redis's INFO format (lines of
// field:value, as INFO and CLUSTER INFO answer), "" when it is absent. It
// is for tools and tests that read Redis's own account of itself.
func InfoField(text, field string) string {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
