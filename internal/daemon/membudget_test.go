package daemon

import (
	"io/fs"
	"testing"
)

// TestDefaultMaxBufferedBytes: a quarter of the cgroup's memory limit, v2
// first, then v1; 256 MiB without a limit or without the files.
func TestDefaultMaxBufferedBytes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"cgroup v2 limit", map[string]string{"/sys/fs/cgroup/memory.max": "536870912\n"}, 128 << 20},
		{"cgroup v2 without limit", map[string]string{"/sys/fs/cgroup/memory.max": "max\n"}, fallbackMaxBufferedBytes},
		{"cgroup v1 limit", map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824\n"}, 256 << 20},
		{"cgroup v1 without limit", map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, fallbackMaxBufferedBytes},
		{"no cgroup files", nil, fallbackMaxBufferedBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := defaultMaxBufferedBytes(func(p string) ([]byte, error) {
				if v, ok := tc.files[p]; ok {
					return []byte(v), nil
				}
				return nil, fs.ErrNotExist
			})
			if got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
}
