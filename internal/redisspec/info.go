package redisspec

import "strings"

// InfoField returns one field of a reply in Redis's INFO format (lines of
// field:value, as INFO and CLUSTER INFO answer), "" when it is absent.
func InfoField(text, field string) string {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
