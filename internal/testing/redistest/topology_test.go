package redistest

import (
	"context"
	"testing"
	"time"
)

// TestClusterFailsOver builds a 3×1 cluster and moves one slot range twice:
// a coordinated CLUSTER FAILOVER, then a kill of the new primary.
func TestClusterFailsOver(t *testing.T) {
	start := time.Now()
	c := StartCluster(t, ClusterOptions{Masters: 3, ReplicasPerMaster: 1})
	t.Logf("cluster up in %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cc := c.Client()
	if err := cc.Set(ctx, "{k}a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m := c.MasterFor(ctx, "{k}a")
	start = time.Now()
	m2 := c.Failover(ctx, m)
	t.Logf("CLUSTER FAILOVER in %v", time.Since(start))
	if m2 == m || c.MasterFor(ctx, "{k}a") != m2 {
		t.Fatal("the slot did not move")
	}
	start = time.Now()
	m3 := c.KillMaster(ctx, m2)
	t.Logf("failover after kill in %v", time.Since(start))
	if m3 != m {
		t.Fatal("the old primary should have been elected back")
	}
	if v, err := cc.Get(ctx, "{k}a").Result(); err != nil || v != "1" {
		t.Fatalf("GET after failovers = %q, %v", v, err)
	}
	start = time.Now()
	c.Rejoin(ctx, m2)
	t.Logf("rejoin in %v", time.Since(start))
}
