package version

import (
	"runtime/debug"
	"testing"
)

func TestStampedVersionWins(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}}}
	got := fromBuild("v1.2.3", bi)
	if got.Version != "v1.2.3" || got.Revision != "abc123" {
		t.Fatalf("got %+v", got)
	}
}

func TestBuildInfoIsTheFallback(t *testing.T) {
	got := fromBuild("", &debug.BuildInfo{Main: debug.Module{Version: "v0.9.0"}})
	if got.Version != "v0.9.0" || got.Revision != "unknown" {
		t.Fatalf("got %+v", got)
	}
	if got := fromBuild("", nil); got.Version != "unknown" {
		t.Fatalf("no build info: %+v", got)
	}
}
