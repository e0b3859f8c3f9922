package toolhints

import (
	"bytes"
	"encoding/json"
)

// Advertise rewrites a tools/list JSON-RPC response (application/json) so
// that every tool protects says true of gets "idempotentHint": true in its
// annotations, unless it already says "readOnlyHint": true, where the hint
// means nothing (schema.ts ToolAnnotations: idempotentHint "is meaningful
// only when readOnlyHint == false"). A result that says "cacheScope":
// "public" is made "private": the hint holds for calls through this
// deployment's policy, not for a shared cache's other readers
// (server/utilities/caching.mdx). Members the rewrite does not touch keep
// their values byte for byte; the objects it rewrites are written with
// their members in sorted order. ok is false, and body is to go on as it
// is, when it is no such response or nothing changes.
func Advertise(body []byte, protects func(tool string) bool) ([]byte, bool) {
	var msg map[string]json.RawMessage
	if json.Unmarshal(body, &msg) != nil || msg["result"] == nil {
		return nil, false
	}
	var result map[string]json.RawMessage
	if json.Unmarshal(msg["result"], &result) != nil || result["tools"] == nil {
		return nil, false
	}
	var tools []map[string]json.RawMessage
	if json.Unmarshal(result["tools"], &tools) != nil {
		return nil, false
	}
	changed := false
	for _, tool := range tools {
		var name string
		if json.Unmarshal(tool["name"], &name) != nil || !protects(name) {
			continue
		}
		ann := map[string]json.RawMessage{}
		if raw, ok := tool["annotations"]; ok && json.Unmarshal(raw, &ann) != nil {
			continue // annotations that are no object are left as they are
		}
		if isTrue(ann["readOnlyHint"]) || isTrue(ann["idempotentHint"]) {
			continue
		}
		ann["idempotentHint"] = json.RawMessage("true")
		raw, err := json.Marshal(ann)
		if err != nil {
			return nil, false
		}
		tool["annotations"] = raw
		changed = true
	}
	if !changed {
		return nil, false
	}
	if bytes.Equal(bytes.TrimSpace(result["cacheScope"]), []byte(`"public"`)) {
		result["cacheScope"] = json.RawMessage(`"private"`)
	}
	var err error
	if result["tools"], err = json.Marshal(tools); err != nil {
		return nil, false
	}
	if msg["result"], err = json.Marshal(result); err != nil {
		return nil, false
	}
	out, err := json.Marshal(msg)
	if err != nil {
		return nil, false
	}
	return out, true
}

func isTrue(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("true")) }
