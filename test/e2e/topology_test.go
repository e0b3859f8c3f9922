package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// onTopology runs the core end-to-end scenarios on Redis at url: the
// article's four outcomes, concurrent attempts, a stream reset, and the
// store going down and coming back (down, up), last.
func onTopology(t *testing.T, url string, down, up func()) {
	at := func(t *testing.T, opts harness.Options) *harness.Env {
		opts.Store = harness.RedisAt(url)
		return harness.Start(t, opts)
	}
	t.Run("article outcomes", func(t *testing.T) { articleOutcomes(t, at) })
	t.Run("concurrent attempts execute once", func(t *testing.T) { concurrentAttempts(t, at) })
	t.Run("stream reset after reservation", func(t *testing.T) { streamReset(t, at) })
	t.Run("redis down fails closed, then recovers", func(t *testing.T) { redisDownFailsClosed(t, at, down, up) })
}

// TestOnCluster: the scenarios on a 3-primary Redis Cluster with a replica
// each; "down" kills every node, "up" restarts them from their files.
func TestOnCluster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1, Persist: true})
	onTopology(t, c.URL(), func() {
		for _, n := range c.Nodes {
			n.Kill()
		}
	}, func() {
		for _, n := range c.Nodes {
			n.Restart()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.WaitHealthy(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestOnSentinel: the scenarios through Sentinel (primary, replica, three
// Sentinels); "down" kills both data nodes, "up" restarts them.
func TestOnSentinel(t *testing.T) {
	g := redistest.StartSentinel(t, redistest.SentinelOptions{Persist: true})
	onTopology(t, g.URL(), func() {
		for _, n := range g.Data {
			n.Kill()
		}
	}, func() {
		for _, n := range g.Data {
			n.Restart()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		g.WaitSynced(ctx)
	})
}
